"""The paced CPU share in words: the do-nothing floor, ``flat``'s whole step above it, and the target.
Design: docs/output.md#harnessoutputpaced_reportpy."""

from __future__ import annotations

from harness.output.formatting import fmt, interval_text, target_verdict
from harness.output.rundata import RunData
from impls.registry import RATIO_BASE
from scenarios import PAPER

TARGET_ABOVE_FLOOR = 1.0  # points of one core: flat's paced whole step over the do-nothing crossing, same run
TARGET_OVER_KERNEL = 0.25  # points of one core: what step() adds to its kernel called straight, same run
FLOOR, WHOLE, ABOVE = "paced_floor_pct", "cpu_share_observed_whole_step_pct", "paced_above_floor_pct"
OVER_KERNEL = "paced_step_over_kernel_pct"


def points(value: float) -> str:
    return f"{fmt(value)} point{'' if value == 1 else 's'}"


def paced_sentence(run: RunData, scenario: str = PAPER, impl: str = RATIO_BASE) -> str:
    """One paragraph: the floor, ``impl``'s paced whole step and its distance to the floor against the target."""
    floor = run.get(scenario, "-", "-", FLOOR)
    if floor is None or floor["status"] != "ok":
        return ""
    reps = floor.get("reps")
    rate = floor.get("step_rate")
    head = (f"Paced at {fmt(rate) if rate == rate and rate else '?'} steps/s from Python "
            f"({int(reps) if reps == reps and reps else '?'} interleaved repetitions; medians [95 % interval]): a "
            f"compiled call that does nothing, once per step, costs {fmt(float(floor['value']))} %"
            f"{interval_text(floor)} of a core over an idle paced loop (`{FLOOR}`: a difference, so its interval "
            f"can reach below 0), the floor of any block manager entered once per step")
    whole, above = run.get(scenario, impl, "batched", WHOLE), run.get(scenario, impl, "batched", ABOVE)
    if whole is None or whole["status"] != "ok" or above is None or above["status"] != "ok":
        return head + f"; `{impl}`'s whole step was not paced in this run."
    return (head + f"; batched `{impl}`'s whole step (one `step()` call per step) {fmt(float(whole['value']))} %"
            f"{interval_text(whole)}, {fmt(float(above['value']))} points above the floor{interval_text(above)} "
            f"(thread CPU inside the calls, paired per repetition). Target: at most {points(TARGET_ABOVE_FLOOR)} "
            f"above the floor, both measured in the same run: {target_verdict(above, TARGET_ABOVE_FLOOR)}."
            + _over_kernel(run, scenario, impl))


def _over_kernel(run: RunData, scenario: str, impl: str) -> str:
    """What ``step()`` adds to its kernel called straight, against its target; "" where not measured."""
    row = run.get(scenario, impl, "batched", OVER_KERNEL)
    if row is None or row["status"] != "ok":
        return ""
    return (f" Of that, `step()` itself (its checks and dispatch) adds {fmt(float(row['value']))} points"
            f"{interval_text(row)} over its kernel called straight with the same arguments (`{OVER_KERNEL}`). "
            f"Target: at most {points(TARGET_OVER_KERNEL)}: {target_verdict(row, TARGET_OVER_KERNEL)}.")
