"""Every module's ``Design: docs/X.md#anchor`` names a heading of that page (GitHub's anchors), and the section
under it names the module: a pointer left behind by a rename or a move is caught."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.test_docs import slug

ROOT = Path(__file__).resolve().parents[1]
POINTER = re.compile(r"Design:\s+(\S+?\.md)(?:#([\w-]+))?(?=[.;,]?(?:\s|$))")


def sections(text: str) -> dict[str, str]:
    """Each heading's anchor (as tests/test_docs.py's ``anchors``) -> its section: the heading and what follows it
    up to the next heading of its level or above."""
    heads, seen, fence = [], {}, False
    lines = text.splitlines()
    for number, line in enumerate(lines):
        fence ^= line.startswith("```")
        match = None if fence else re.match(r"^(#{1,6}) (.+)$", line)
        if match:
            base = slug(match.group(2))
            heads.append((number, len(match.group(1)), base if base not in seen else f"{base}-{seen[base]}"))
            seen[base] = seen.get(base, 0) + 1
    return {anchor: "\n".join(lines[start:next((n for n, lv, _ in heads[i + 1:] if lv <= level), len(lines))])
            for i, (start, level, anchor) in enumerate(heads)}


def names_of(path: Path, root: Path) -> list[str]:
    """How a page may name the module at ``path``: `stem`, stem.py, its path, its dotted name (a package: its
    folder)."""
    rel = path.relative_to(root).as_posix()
    stem = path.parent.name if path.stem == "__init__" else path.stem
    dotted = rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    return [f"`{stem}`", f"{stem}.py", rel, dotted, rel.removesuffix("__init__.py")]


def problems(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the ``Design:`` pointers of the module docstring of ``path``."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    found, out = list(POINTER.finditer(doc)), []
    if doc.count("Design:") != len(found):
        out.append("a Design: pointer that is not `Design: docs/PAGE.md#anchor`")
    for m in found:
        page, anchor = root / m.group(1), m.group(2)
        if not page.is_file():
            out.append(f"{m.group(1)}: no such page")
        elif not anchor:
            out.append(f"{m.group(1)}: names no heading (add #anchor)")
        elif anchor not in (parts := sections(page.read_text(encoding="utf-8"))):
            out.append(f"{m.group(1)}#{anchor}: no such heading")
        elif not any(name in parts[anchor] for name in names_of(path, root)):
            out.append(f"{m.group(1)}#{anchor}: the section does not name the module")
    return out


MODULES = sorted(p for top in ("harness", "impls", "scenarios") for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_design_pointer_names_a_heading_whose_section_names_the_module(path: Path) -> None:
    assert problems(path) == []


def test_the_pointers_are_there_to_check() -> None:
    assert sum(bool(POINTER.search(ast.get_docstring(ast.parse(p.read_text())) or "")) for p in MODULES) > 50


def test_a_stale_pointer_is_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "m.md").write_text(
        "# Page\n\n## Studies\n\n### `rows`\n\nThe rows mirror.\n\n### `copied`, `x`\n\nWhat `copied` does.\n\n"
        "```\n# code\n```\n\n## harness/a/b.py\n\nB.\n")
    pkg = tmp_path / "harness" / "a"
    pkg.mkdir(parents=True)
    cases = [("copied.py", "docs/m.md#copied-x", []),
             ("b.py", "docs/m.md#harnessabpy", []),
             ("copied.py", "docs/m.md#studies", []),  # a section holds its subsections
             ("copied.py", "docs/m.md#rows", ["docs/m.md#rows: the section does not name the module"]),
             ("gone.py", "docs/m.md#code", ["docs/m.md#code: no such heading"]),
             ("page.py", "docs/n.md#page", ["docs/n.md: no such page"]),
             ("bare.py", "docs/m.md", ["docs/m.md: names no heading (add #anchor)"]),
             ("prose.py", "see docs/m.md", ["a Design: pointer that is not `Design: docs/PAGE.md#anchor`"])]
    for name, pointer, expected in cases:
        (pkg / name).write_text(f'"""A module.\nDesign: {pointer}."""\n')
        assert problems(pkg / name, tmp_path) == expected, (name, pointer)
