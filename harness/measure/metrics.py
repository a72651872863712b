"""From raw replay samples to the figures we publish. Pure functions: tested with fake timings.

Every figure is the median over repetitions of a per-repetition value, and every row says how it was made:

- ``seq_step_ns``: block-manager time per running sequence per step (all pool operations, the decode appends,
  and in the per-call regime the slot lookups), total time / sequence-steps;
- ``step_p50_ns`` / ``step_p99_ns`` / ``step_max_ns``: distribution of whole-step times;
- ``lookup_ns``: the slot lookup the attention kernel needs (newest token of each running sequence ->
  physical block and slot), per lookup;
- ``alloc_ns`` / ``free_ns`` / ``alloc_free_ns``: ``allocate`` time per block it takes, ``free`` time per
  table block it releases (its table's length: shared blocks are released, not always returned to the pool),
  and both together per block;
- ``cpu_share_pct``: block-manager CPU time per second at the target step rate, computed from the closed-loop
  mean step time (``mean_step_ns * step_rate / 1e9 * 100``);
- ``harness_overhead_pct``: the calibrated cost of the timer reads around the step's work, relative to the
  step time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.measure.drivers import KINDS, StepTimes
from harness.output.results import Row

_K = {name: i for i, name in enumerate(KINDS)}


@dataclass(frozen=True)
class Work:
    """What a trace asks of a manager: the denominators of the per-unit figures."""

    seq_steps: int
    steps: int
    blocks_allocated: int
    blocks_freed: int
    running: int = 0  # most sequences running in one step (the scenario's concurrency)

    @classmethod
    def of(cls, prep) -> Work:
        trace = prep.trace
        return cls(
            seq_steps=int(trace.running_per_step().sum()),
            steps=trace.num_steps,
            blocks_allocated=int(prep.op_blocks[trace.op == 1].sum()),
            blocks_freed=int(prep.op_blocks[trace.op == 3].sum()),
            running=int(trace.running_per_step().max(initial=0)),
        )


def _median(samples: Sequence[StepTimes], fn: Callable[[StepTimes], float]) -> float:
    return float(statistics.median(fn(s) for s in samples))


def timing_rows(
    cell: tuple[str, str, str],
    work: Work,
    step_samples: Sequence[StepTimes],
    detail_samples: Sequence[StepTimes],
    step_rate: float,
    timer_overhead_ns: float,
    how: str,
) -> list[Row]:
    """The timing figures of one (scenario, impl, regime) cell.

    ``step_samples`` give the step-time figures, ``detail_samples`` the per-operation ones (the same replays
    for interpreted drivers; separate replays for the compiled driver, which times whole steps as one region
    and operations one by one in different passes).
    """
    scenario, impl, regime = cell
    clock = step_samples[0].clock
    reps = len(step_samples)
    how = f"{how}; median of {reps} rep(s)"

    def row(metric: str, value: float | None, unit: str, note: str = "", rate: float | None = None) -> Row:
        if value is None:
            return Row(scenario, impl, regime, metric, float("nan"), unit, clock, "skipped", note)
        return Row(scenario, impl, regime, metric, value, unit, clock, "ok", f"{how}{'; ' + note if note else ''}",
                   reps=reps, steps=work.steps, step_rate=rate, seqs=work.running)

    def kind_total(s: StepTimes, *kinds: str) -> float:
        return float(sum(s.ns[:, _K[k]].sum() for k in kinds))

    mean_step = _median(step_samples, lambda s: float(s.step_ns.mean()))
    rows = [
        row("seq_step_ns", _median(step_samples, lambda s: float(s.step_ns.sum()) / work.seq_steps), "ns"),
        row("step_p50_ns", _median(step_samples, lambda s: float(np.percentile(s.step_ns, 50))), "ns"),
        row("step_p99_ns", _median(step_samples, lambda s: float(np.percentile(s.step_ns, 99))), "ns"),
        row("step_max_ns", _median(step_samples, lambda s: float(s.step_ns.max())), "ns"),
        row("step_mean_ns", mean_step, "ns"),
        row("cpu_share_pct", mean_step * step_rate / 1e9 * 100, "%",
            f"computed: mean step time x {step_rate:g} steps/s", rate=step_rate),
        row("lookup_ns", _median(detail_samples, lambda s: kind_total(s, "lookup") / work.seq_steps), "ns",
            "per lookup"),
    ]
    alloc = (_median(detail_samples, lambda s: kind_total(s, "alloc") / work.blocks_allocated)
             if work.blocks_allocated else None)
    free = _median(detail_samples, lambda s: kind_total(s, "free") / work.blocks_freed) if work.blocks_freed else None
    moved = work.blocks_allocated + work.blocks_freed
    both = _median(detail_samples, lambda s: kind_total(s, "alloc", "free") / moved) if moved else None
    # Each allocate/free is its own timed region, so these include one timer read per call (harness_overhead_ns
    # / regions per step gives its size); the whole-step figures above time each step as one region.
    per_call = f"one timed region per call, {timer_overhead_ns:.0f} ns timer cost included"
    rows += [
        row("alloc_ns", alloc, "ns",
            f"per block taken by allocate; {per_call}" if alloc is not None else "no allocate in trace"),
        row("free_ns", free, "ns",
            f"per table block released by free; {per_call}" if free is not None else "no free in trace"),
        row("alloc_free_ns", both, "ns", f"per block taken or released; {per_call}"),
    ]
    regions = statistics.median(s.timed_regions_per_step for s in step_samples)
    overhead = regions * timer_overhead_ns
    rows += [
        Row(scenario, impl, regime, "harness_overhead_ns", overhead, "ns", "calibration",
            how=f"{regions:.1f} timed region(s) per step x {timer_overhead_ns:.1f} ns (empty region, {clock})"),
        Row(scenario, impl, regime, "harness_overhead_pct", overhead / mean_step * 100 if mean_step else 0.0, "%",
            "calibration", how="calibrated timer cost per step / mean step time"),
    ]
    return rows
