"""The README's results section is what `kvblock-bench report --readme` generates from the committed reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.output.readme import BEGIN, END, ReadmeError, current_section, replace_section, section
from harness.output.rundata import RunData

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_match_the_reference_run() -> None:
    expected = section(RunData.load(ROOT / "results" / "reference")).strip("\n")
    assert current_section((ROOT / "README.md").read_text(encoding="utf-8")) == expected, (
        "README.md's results section differs from results/reference: run "
        "`kvblock-bench report results/reference --readme README.md --no-figures`")


def test_markers_are_required_and_replaced_in_place() -> None:
    text = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert replace_section(text, "new") == f"head\n{BEGIN}\nnew\n{END}\ntail\n"
    with pytest.raises(ReadmeError):
        replace_section("no markers", "x")
    with pytest.raises(ReadmeError):
        replace_section(f"{END}\n{BEGIN}", "x")
