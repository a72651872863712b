"""The CI profile: the run that ``make bench-ci``, ``scripts/ci_compare.sh`` and ``scripts/compare_pairs.py`` measure.
Design: docs/output.md#harnessciprofilepy."""

from __future__ import annotations

import shlex
import sys

from scenarios import PAPER

SCENARIO = PAPER
REGIMES = ("batched", "step")
SKIPPED_STUDIES = ("--no-paced", "--no-l1d", "--no-allocations", "--no-table-copy")


def run_args(extra_impls: tuple[str, ...] | list[str] = (), impls: list[str] | None = None) -> list[str]:
    """``kvblock-bench run``'s arguments for the CI profile: ``impls`` (default: all) plus ``extra_impls``."""
    args = ["--scenario", SCENARIO, "--regime", ",".join(REGIMES), *SKIPPED_STUDIES]
    if extra_impls or impls is not None:
        from impls import REGISTRY, UNAVAILABLE

        args += ["--impl", ",".join([*([*REGISTRY, *UNAVAILABLE] if impls is None else impls), *extra_impls])]
    return args


def pull_request_impls() -> list[str]:
    """What CI's ``ab`` times by default: the article's designs, in Python/Numba and in C++ (docs/ci.md)."""
    from impls.registry import RECORDS

    return [r.name for r in RECORDS if r.compares_with_article]


PULL_REQUEST_FLAG = "--pull-request"

if __name__ == "__main__":
    extra = [a for a in sys.argv[1:] if a != PULL_REQUEST_FLAG]
    print(shlex.join(run_args(extra, pull_request_impls() if PULL_REQUEST_FLAG in sys.argv[1:] else None)))
