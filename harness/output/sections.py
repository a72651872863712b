"""Which markdown file holds each generated section: the one place that says so (paths from the repository root)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.base.project import ROOT

FILES = {
    "results": "README.md",  # kvblock-bench report RUN --readme README.md
    "times": "docs/time-budget.md",  # the same command, and scripts/make_times.py
    "growth": "docs/scale.md",  # kvblock-bench report results/scale --growth-readme docs/scale.md
    "compare-pairs": "docs/ci.md",  # python scripts/compare_pairs.py --readme
    "compare-pairs-summary": "README.md",  # the same command
    "history-vllm": "README.md",  # kvblock-bench report results/history/vllm --history-readme README.md
    "history-sglang": "README.md",  # kvblock-bench report results/history/sglang --history-readme README.md
    "history-lmdeploy": "README.md",
    "history-tvm": "README.md",
    "ci-example": "README.md",  # python -m harness.facts (from examples/ci/github-actions.yml)
    "ci-plugin-example": "docs/ci.md",  # the same command (from examples/ci/plugin-repository.yml)
}
# Every page whose generated sections, facts, links and figures the tests hold (globs from the root).
PAGES = ("README.md", "ARCHITECTURE.md", "docs/*.md", "results/README.md", "results/*/README.md",
         "examples/**/README.md", "harness/data/README.md")


def doc_path(section: str, root: Path = ROOT) -> Path:
    """The file that holds ``section`` in the repository at ``root``."""
    return root / FILES[section]


def pages(root: Path = ROOT) -> list[Path]:
    """Every page of :data:`PAGES` in the checkout at ``root``, in a stable order."""
    return [p for pattern in PAGES for p in sorted(root.glob(pattern)) if p.is_file()]


def beside(readme: Path, section: str) -> Path:
    """The file that holds ``section`` in the checkout whose results file is ``readme``."""
    rel = os.path.relpath(FILES[section], os.path.dirname(FILES["results"]) or ".")
    return readme.parent / rel
