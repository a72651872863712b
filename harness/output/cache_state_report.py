"""The whole step replayed alone, in words. Design: docs/output.md#harnessoutputcache_state_reportpy."""

from __future__ import annotations

from harness.output.formatting import fmt, interval_text, target_word
from harness.output.rundata import RunData
from harness.studies import cache_state, limit_loop, twin_pair
from impls.registry import RATIO_BASE, RECORDS
from scenarios import PAPER

WARM, COLD = cache_state.METRICS["warm"], cache_state.METRICS["cold"]
SHOWN = (RATIO_BASE, "cpp-flat")


def _ok(row: dict | None) -> bool:
    return row is not None and row["status"] == "ok"


def _figures(run: RunData, scenario: str, impl: str) -> str:
    warm, cold = run.get(scenario, impl, "batched", WARM), run.get(scenario, impl, "batched", COLD)
    if not (_ok(warm) and _ok(cold)):
        return ""
    return (f"`{impl}` {fmt(float(warm['value']))} ns{interval_text(warm)} warm and "
            f"{fmt(float(cold['value']))} ns{interval_text(cold)} cold")


def limit_text(run: RunData, scenario: str = PAPER) -> str:
    """The yardsticks replayed beside ``flat`` (``limit_loop``), and ``flat`` over each, a sentence each."""
    text = ""
    for stick in limit_loop.YARDSTICKS:
        figures = [run.get(scenario, "-", "-", m) for m in stick.metrics.values()]
        ratios = [run.get(scenario, RATIO_BASE, "batched", m) for m in stick.ratios.values()]
        if not all(_ok(row) for row in figures + ratios):
            continue
        (warm, cold), (warm_x, cold_x) = figures, ratios
        text += (f" {stick.label}: {fmt(float(warm['value']))} ns"
                 f"{interval_text(warm)} warm and {fmt(float(cold['value']))} ns{interval_text(cold)} cold; "
                 f"`{RATIO_BASE}` takes {fmt(float(warm_x['value']))}×{interval_text(warm_x)} its time warm and "
                 f"{fmt(float(cold_x['value']))}×{interval_text(cold_x)} cold (slice against slice).")
    return text


def twin_text(run: RunData, scenario: str = PAPER) -> str:
    """Each compiled design over its C++ twin, paired slice against slice (``twin_pair``), and the target's verdict."""
    parts = []
    for design, twin in ((r.twin_of, r.name) for r in RECORDS if r.twin_of):
        warm, cold = (run.get(scenario, design, "batched", m) for m in twin_pair.RATIOS.values())
        if _ok(warm) and _ok(cold):
            parts.append(f"`{design}` over `{twin}` {fmt(float(warm['value']))}×{interval_text(warm)} warm, "
                         f"{target_word(warm, twin_pair.TARGET)}, and {fmt(float(cold['value']))}×"
                         f"{interval_text(cold)} cold, {target_word(cold, twin_pair.TARGET)}")
    if not parts:
        return ""
    return (" Each compiled design paired with its C++ twin (`twin_pair`: the two in turn on each slice in the "
            f"design's worker), against a target of at most {fmt(twin_pair.TARGET)}× (met: the whole interval at or "
            f"below it; missed: above it): {'; '.join(parts)}.")


def cache_state_sentence(run: RunData, scenario: str = PAPER, impls: tuple[str, ...] = SHOWN) -> str:
    """The shown designs' whole step alone, warm and cold, beside the run's own figure and the minimal loop."""
    parts = [text for impl in impls if (text := _figures(run, scenario, impl))]
    if not parts:
        return ""
    ours = run.get(scenario, impls[0], "batched", "seq_step_ns")
    among = (f" The run's own `{impls[0]}` figure, {fmt(float(ours['value']))} ns{interval_text(ours)}, times "
             "slices that start in the caches other designs' slices left, so it moves with the designs a run "
             "holds." if _ok(ours) else "")
    return ("Replayed alone in its worker after the timings (`cache_state`), the batched whole step per "
            f"sequence-step: {'; '.join(parts)} (warm: whole replays back to back; cold: the caches flushed before "
            f"every slice of the trace, as each row's `how` says).{among}{twin_text(run, scenario)}"
            f"{limit_text(run, scenario)}")
