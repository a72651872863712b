"""From raw replay samples to the published figures (pure functions). Design: docs/measurement.md#metrics."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.base.drivers import KINDS, StepTimes
from harness.base.oncpu import FRACTION, SLACK_NS, ran_share, ran_whole
from harness.base.rows import Row
from harness.base.stats import block_medians, block_sums, ratio_of_sums
from scenarios.trace import ALLOCATE, ALLOCATE_CACHED, FREE

_K = {name: i for i, name in enumerate(KINDS)}


@dataclass(frozen=True)
class Work:
    """What a trace asks of a manager, per step: the denominators of the per-unit figures."""

    seq_steps_per_step: np.ndarray
    alloc_blocks_per_step: np.ndarray
    free_blocks_per_step: np.ndarray

    @classmethod
    def of(cls, prep) -> Work:
        return cls.of_trace(prep.trace, prep.op_blocks)

    @classmethod
    def of_trace(cls, trace, op_blocks: np.ndarray | None = None) -> Work:
        """The work of ``trace`` (``op_blocks`` made by ``drivers.op_block_counts`` when not given)."""
        if op_blocks is None:
            from harness.base.drivers import op_block_counts

            op_blocks = op_block_counts(trace)[0]
        step_of_op = np.searchsorted(trace.step_offsets, np.arange(len(trace.op)), side="right") - 1
        per_step = [np.bincount(step_of_op, weights=op_blocks * np.isin(trace.op, codes), minlength=trace.num_steps)
                    for codes in ((ALLOCATE, ALLOCATE_CACHED), (FREE,))]
        return cls(trace.running_per_step().astype(float), *per_step)

    @classmethod
    def uniform(cls, steps: int, seqs_per_step: float, alloc_blocks: float = 0, free_blocks: float = 0) -> Work:
        """The same work in every step (for tests and synthetic inputs)."""
        return cls(np.full(steps, float(seqs_per_step)), np.full(steps, alloc_blocks / steps),
                   np.full(steps, free_blocks / steps))

    @property
    def steps(self) -> int:
        return len(self.seq_steps_per_step)

    @property
    def seq_steps(self) -> int:
        return int(self.seq_steps_per_step.sum())

    @property
    def blocks_allocated(self) -> int:
        return round(self.alloc_blocks_per_step.sum())

    @property
    def blocks_freed(self) -> int:
        return round(self.free_blocks_per_step.sum())

    @property
    def running(self) -> int:
        """Most sequences running in one step (the scenario's concurrency)."""
        return int(self.seq_steps_per_step.max(initial=0))


def all_steps(work: Work) -> list[tuple[int, int]]:
    """One slice covering every step."""
    return [(0, work.steps)]


def stacked(samples: Sequence[StepTimes], fn: Callable[[StepTimes], np.ndarray]) -> np.ndarray:
    """``fn`` of every sample, ``[reps, steps]``, preempted samples NaN (``oncpu.ran_whole``)."""
    values = np.stack([np.asarray(fn(s), dtype=float) for s in samples])
    if any(s.ran is None or s.span_ns is None for s in samples):
        return values
    return ran_whole(values, np.stack([s.span_ns for s in samples]), np.stack([s.ran for s in samples]))


def step_ns_lists(samples: Sequence[StepTimes]) -> list[list[int | None]]:
    """Each repetition's whole-step ns for a raw file, None for a preempted sample (``stacked``)."""
    values = stacked(samples, lambda s: s.step_ns)
    return [[None if v != v else round(v) for v in rep.tolist()] for rep in values]


def _time(samples: Sequence[StepTimes], slices, fn: Callable[[StepTimes], np.ndarray]) -> np.ndarray:
    """Per slice, the sum of each step's median over the repetitions, then per resample (``block_medians``)."""
    return block_medians(stacked(samples, fn), slices)


# The figures timed per step and repetition (:func:`rep_times`).
TIMED_FIGURES = ("seq_step_ns", "step_mean_ns", "lookup_ns", "alloc_ns", "free_ns", "alloc_free_ns")


def _figures(work: Work) -> dict[str, tuple[bool, Callable[[StepTimes], np.ndarray], np.ndarray]]:
    """Per timed figure: whether it reads the detail samples, its time per step of a sample, its work per step."""
    def kind(*kinds: str) -> Callable[[StepTimes], np.ndarray]:
        return lambda s: sum(s.ns[:, _K[k]] for k in kinds)

    def whole(s: StepTimes) -> np.ndarray:
        return s.step_ns

    seq = work.seq_steps_per_step
    figures = (
        (False, whole, seq),
        (False, whole, np.ones(work.steps)),
        (True, kind("lookup"), seq),
        (True, kind("alloc"), work.alloc_blocks_per_step),
        (True, kind("free"), work.free_blocks_per_step),
        (True, kind("alloc", "free"), work.alloc_blocks_per_step + work.free_blocks_per_step),
    )
    return dict(zip(TIMED_FIGURES, figures, strict=True))


def cell_blocks(work: Work, step_samples: Sequence[StepTimes], detail_samples: Sequence[StepTimes],
                slices: list[tuple[int, int]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per block (a slice of steps): (time, work) of each timed figure, the input of every estimate."""
    return {metric: (_time(detail_samples if detail else step_samples, slices, fn), block_sums(per_step, slices))
            for metric, (detail, fn, per_step) in _figures(work).items()}


def rep_times(work: Work, step_samples: Sequence[StepTimes], detail_samples: Sequence[StepTimes]
              ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per timed figure: (time per repetition and step ``[reps, steps]``, work per step), in repetition order."""
    return {metric: (stacked(detail_samples if detail else step_samples, fn), per_step)
            for metric, (detail, fn, per_step) in _figures(work).items()}


PER_OPERATION = ("lookup_ns", "alloc_ns", "free_ns", "alloc_free_ns")


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
    slices: list[tuple[int, int]] | None = None,
    whole_steps: bool = False,
) -> list[Row]:
    """The timing figures of one (scenario, impl, regime) cell."""
    scenario, impl, regime = cell
    slices = slices or all_steps(work)
    clock = step_samples[0].clock
    reps = len(step_samples)
    blocks = cell_blocks(work, step_samples, detail_samples, slices)
    how = (f"{how}; each step's median over {reps} rep(s), summed, over the work; 95 % bootstrap interval over "
           f"{len(slices)} slices and the {reps} rep(s)")
    common = {"reps": reps, "steps": work.steps, "seqs": work.running}

    def row(metric: str, unit: str, note: str = "", scale: float = 1.0, rate: float | None = None) -> Row:
        time, amount = blocks[metric.replace("cpu_share_pct", "step_mean_ns")]
        if whole_steps and metric in PER_OPERATION:
            return Row(scenario, impl, regime, metric, float("nan"), unit, clock, "skipped",
                       "one step() call per step is timed as one region: no per-operation figure")
        if not amount.sum():
            return Row(scenario, impl, regime, metric, float("nan"), unit, clock, "skipped", note or "no such work")
        est = ratio_of_sums(time, amount)
        return Row(scenario, impl, regime, metric, est.value * scale, unit, clock, "ok",
                   f"{how}{'; ' + note if note else ''}", ci_low=_scaled(est.low, scale),
                   ci_high=_scaled(est.high, scale), step_rate=rate, **common)

    def pct(metric: str, fn: Callable[[StepTimes], float]) -> Row:
        return Row(scenario, impl, regime, metric, _median(step_samples, fn), "ns", clock, "ok",
                   f"{how.split(';')[0]}; median over repetitions", **common)

    # Each allocate/free is its own timed region, so these include one timer read per call.
    per_call = f"one timed region per call, {timer_overhead_ns:.0f} ns timer cost included"
    rows = [
        row("seq_step_ns", "ns"),
        pct("step_p50_ns", lambda s: float(np.percentile(s.step_ns, 50))),
        pct("step_p99_ns", lambda s: float(np.percentile(s.step_ns, 99))),
        pct("step_max_ns", lambda s: float(s.step_ns.max())),
        row("step_mean_ns", "ns"),
        row("cpu_share_pct", "%", f"computed: mean step time x {step_rate:g} steps/s", step_rate / 1e9 * 100,
            step_rate),
        row("lookup_ns", "ns", "per lookup"),
        row("alloc_ns", "ns", f"per block taken by allocate; {per_call}"),
        row("free_ns", "ns", f"per table block released by free; {per_call}"),
        row("alloc_free_ns", "ns", f"per block taken or released; {per_call}"),
    ]
    mean_step = ratio_of_sums(*blocks["step_mean_ns"]).value
    regions = statistics.median(s.timed_regions_per_step for s in step_samples)
    overhead = regions * timer_overhead_ns
    rows += [
        Row(scenario, impl, regime, "harness_overhead_ns", overhead, "ns", "calibration",
            how=f"{regions:.1f} timed region(s) per step x {timer_overhead_ns:.1f} ns (empty region, {clock})"),
        Row(scenario, impl, regime, "harness_overhead_pct", overhead / mean_step * 100 if mean_step else 0.0, "%",
            "calibration", how="calibrated timer cost per step / mean step time"),
        *on_cpu_rows(cell, step_samples, common),
    ]
    return rows


def on_cpu_rows(cell: tuple[str, str, str], samples: Sequence[StepTimes], common: dict) -> list[Row]:
    """The cell's on-CPU share and its preempted step samples (``oncpu``); none where not read."""
    wall, cpu = sum(s.wall_ns for s in samples), sum(s.cpu_ns for s in samples)
    marks = [s.preempted for s in samples]
    if not wall or any(m is None for m in marks):
        return []
    steps = sum(len(m) for m in marks)
    preempted = sum(int(m.sum()) for m in marks) / max(1, steps) * 100
    how = "thread CPU time over wall time around each timed slice (time.thread_time_ns beside perf_counter_ns)"
    return [Row(*cell, "on_cpu_pct", ran_share(wall, cpu) * 100, "%", "thread cpu clock", how=how, **common),
            Row(*cell, "preempted_steps_pct", preempted, "%", "thread cpu clock",
                how=f"step samples whose thread was off its CPU beyond {SLACK_NS / 1e3:g} us + {FRACTION:.0%} of "
                    "the interval (per step from Python, per slice for compiled and C++ replays); left out of the "
                    "figures", **common)]


def _scaled(x: float, scale: float) -> float | None:
    return None if x != x else x * scale
