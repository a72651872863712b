"""The CI profile: the run that ``make bench-ci``, ``scripts/ci_compare.sh`` and ``scripts/compare_pairs.py`` measure.

Every registered implementation, batched and in the step regime (one Python ``step()`` call per decode step:
like against like, plug-ins included), on the ``paper`` scenario at full length with the default repetitions:
the article's workload and the regimes every design's headline figures come from (its time: README, "Time
budget"). Left out, because they cost minutes and ``compare`` reads none of them: the
paced runs, L1D counts, allocation counts and the table-copy study (the gate counts allocations and
instructions exactly). The studies that always run take seconds.

``python -m harness.ci.profile [IMPL ...]`` prints the arguments of ``kvblock-bench run`` for a shell; extra
implementations (plug-ins) are added to every registered one.
"""

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
