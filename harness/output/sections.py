"""Which markdown file holds each generated section: the one place that says so (paths from the repository root)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "results": "README.md",  # kvblock-bench report RUN --readme README.md
    "times": "docs/time-budget.md",  # the same command, and scripts/make_times.py
    "growth": "docs/scale.md",  # kvblock-bench report results/scale --growth-readme docs/scale.md
    "compare-pairs": "docs/ci.md",  # python scripts/compare_pairs.py --readme
    "compare-pairs-summary": "README.md",  # the same command
}


def doc_path(section: str, root: Path = ROOT) -> Path:
    """The file that holds ``section`` in the repository at ``root``."""
    return root / FILES[section]


def beside(readme: Path, section: str) -> Path:
    """The file that holds ``section`` in the checkout whose results file is ``readme``."""
    rel = os.path.relpath(FILES[section], os.path.dirname(FILES["results"]) or ".")
    return readme.parent / rel
