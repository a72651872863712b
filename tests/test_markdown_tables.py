"""One writer of Markdown tables: ``harness.output.markdown.markdown_table``; no other module writes a table's rule."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from harness.output.markdown import markdown_table

ROOT = Path(__file__).resolve().parents[1]
WRITER = ROOT / "harness" / "output" / "markdown.py"
# A cell of a table's rule between two bars or a bar and the string's end: "|---|", "| :--- |", "---|" (an
# f-string's parts are read apart); "FILE | --from-csv" is no rule.
RULE = re.compile(r"(^|\|)\s*:?-{3,}:?\s*(\||$)")


def rules_written(path: Path) -> list[int]:
    """The lines of ``path`` whose string literals (f-strings' parts included) hold a piece of a table's rule."""
    return sorted({node.lineno for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and RULE.search(node.value)})


def test_markdown_table_writes_the_header_its_rule_and_a_line_per_row() -> None:
    assert markdown_table(["a", "b c"], [["1", ""], ("`x`", "y")]) == [
        "| a | b c |", "|---|---|", "| 1 |  |", "| `x` | y |"]
    assert markdown_table(["a"], iter([])) == ["| a |", "|---|"]


@pytest.mark.parametrize("row", [["1"], ["1", "2", "3"]])
def test_a_row_of_another_width_than_the_header_is_refused(row: list[str]) -> None:
    with pytest.raises(ValueError, match="cells under a header of 2"):
        markdown_table(["a", "b"], [["x", "y"], row])


def test_the_check_sees_rules_in_every_spelling(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('A = "|---|---|"\nB = f"|{x}" + "---|" * n\nC = "| :--- | ---: |"\nD = f"{x}|---"\n'
                      'E = "-o FILE | --from-csv CSV"\nF = "a --- b"\n')
    assert rules_written(source) == [1, 2, 3, 4]


@pytest.mark.parametrize("path", sorted({*ROOT.glob("harness/**/*.py"), *ROOT.glob("scripts/*.py")} - {WRITER}),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_module_but_the_writer_writes_a_table_rule(path: Path) -> None:
    lines = rules_written(path)
    assert not lines, (f"{path.relative_to(ROOT)}:{lines[0]} writes a Markdown table's rule itself: build the "
                       "table with harness.output.markdown.markdown_table(header, rows)")
