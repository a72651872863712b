"""Docstrings say what a thing is and promises, briefly: prose lines per code line stay under a ceiling.

Prose is every docstring line and every comment line; code is every line with a token that is not a docstring.
A code line with a trailing comment counts as both. Run as a script to print the ratio per folder and the files
with the most prose.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CEILING = 0.12
_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING}


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of the module's, classes' and functions' docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def prose_and_code(source: str) -> tuple[int, int]:
    """(prose lines, code lines) of one module's source."""
    docs = docstring_lines(ast.parse(source))
    comments, code = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments.add(tok.start[0])
        elif tok.type not in _LAYOUT:
            code.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(docs | comments), len(code)


def folder_counts(folder: str) -> dict[Path, tuple[int, int]]:
    return {p: prose_and_code(p.read_text()) for p in sorted((ROOT / folder).rglob("*.py"))}


def ratio(counts: dict[Path, tuple[int, int]]) -> float:
    return sum(p for p, _ in counts.values()) / max(1, sum(c for _, c in counts.values()))


def test_prose_counting_sees_docstrings_comments_and_trailing_comments() -> None:
    source = '"""Doc\nline two."""\n\nx = 1  # trailing\n# alone\n\n\ndef f():\n    """One."""\n    return x\n'
    assert prose_and_code(source) == (5, 3)


@pytest.mark.parametrize("folder", ["impls", "harness"])
def test_prose_per_code_line_stays_under_the_ceiling(folder: str) -> None:
    counts = folder_counts(folder)
    worst = sorted(counts.items(), key=lambda kv: -kv[1][0])[:5]
    assert ratio(counts) <= CEILING, (
        f"{folder}/: {ratio(counts):.3f} prose lines per code line (ceiling {CEILING}); most prose: "
        + ", ".join(f"{p.relative_to(ROOT)} {n}" for p, (n, _) in worst))


if __name__ == "__main__":
    for folder in sys.argv[1:] or ["impls", "harness"]:
        counts = folder_counts(folder)
        print(f"{folder}: {ratio(counts):.3f} ({sum(p for p, _ in counts.values())} prose, "
              f"{sum(c for _, c in counts.values())} code; ceiling {CEILING})")
        for path, (p, c) in sorted(counts.items(), key=lambda kv: -kv[1][0])[:15]:
            print(f"  {p:4d} {c:5d}  {path.relative_to(ROOT)}")
