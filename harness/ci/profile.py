"""The CI profile: the run that ``make bench-ci``, ``scripts/ci_compare.sh`` and ``scripts/compare_pairs.py`` measure.
Design: docs/output.md#harnessciprofilepy."""

from __future__ import annotations

import shlex
import sys

from scenarios import PAPER

SCENARIO = PAPER
REGIMES = ("batched", "step")
SKIPPED_STUDIES = ("--no-paced", "--no-l1d", "--no-allocations", "--no-table-copy")


def run_args(extra_impls: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The arguments of ``kvblock-bench run`` for the CI profile (plus ``extra_impls``, e.g. a plug-in)."""
    args = ["--scenario", SCENARIO, "--regime", ",".join(REGIMES), *SKIPPED_STUDIES]
    if extra_impls:
        from impls import REGISTRY, UNAVAILABLE

        args += ["--impl", ",".join([*REGISTRY, *UNAVAILABLE, *extra_impls])]
    return args


if __name__ == "__main__":
    print(shlex.join(run_args(sys.argv[1:])))
