"""The paced CPU share in words: the do-nothing floor, ``flat``'s whole step above it, and the target.
Design: docs/output.md#harnessoutputpaced_reportpy."""

from __future__ import annotations

from harness.output.formatting import fmt, interval_of, interval_text
from harness.output.rundata import RunData
from impls.registry import RATIO_BASE
from scenarios import PAPER

TARGET_ABOVE_FLOOR = 1.0  # points of one core: flat's paced whole step over the do-nothing crossing, same run
FLOOR, WHOLE, ABOVE = "paced_floor_pct", "cpu_share_observed_whole_step_pct", "paced_above_floor_pct"


def verdict(row: dict | None) -> str:
    """Whether ``paced_above_floor_pct`` meets the target: judged on its interval, never on the point alone."""
    bounds = interval_of(row)
    if bounds is None:
        return "not decided (no interval: run the paced study with at least two repetitions)"
    if bounds[1] <= TARGET_ABOVE_FLOOR:
        return "met (the whole interval is at or below it)"
    if bounds[0] > TARGET_ABOVE_FLOOR:
        return "missed (the whole interval is above it)"
    return "not decided (the interval holds it)"


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
            f"(thread CPU inside the calls, paired per repetition). Target: at most {fmt(TARGET_ABOVE_FLOOR)} "
            f"point{'' if TARGET_ABOVE_FLOOR == 1 else 's'} above the floor, both "
            f"measured in the same run: {verdict(above)}.")
