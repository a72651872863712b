"""A release's figures from its worker's samples: ``run``'s per-unit metrics with their intervals.
Design: docs/output.md#harnesshistoryrelease_figurespy."""

from __future__ import annotations

import math
from collections.abc import Mapping

from harness.base.interleave import SLICES_PER_REP, slice_bounds
from harness.base.metrics import cell_blocks
from harness.base.stats import ratio_of_sums
from harness.calibration.replays import Measured
from harness.engines.call_meter import MeteredReplays
from harness.history.records import CALL_METRICS, METRICS, UNITS, HistoryRow

NAN = math.nan
CALLS_HOW = ("shared = the metered replay's whole timed step - its engine calls; median, min-max (not a 95 % interval) "
             "over the metered replays, after the timed repetitions; every release in a worker process of its own, "
             "in lockstep")


def how(value: Measured, baseline: str, metric: str, reps: int) -> str:
    return (f"{baseline}: the engine's code through the batched regime of the harness's Python driver "
            f"(run_interpreted), replay checked against its trace; {UNITS[metric]}: each step's median over {reps} "
            f"repetitions, summed, over the work; 95 % bootstrap interval over {SLICES_PER_REP} slices and the "
            f"repetitions; every release in a worker process of its own, in lockstep; {value.plan}")


def measured_rows(value: Measured, baselines: Mapping[str, str], common: dict, note: str = "") -> list[HistoryRow]:
    """Per baseline of ``baselines`` (name -> caching mode), a row per metric, ``note`` in its how; a failed
    replay's rows say why."""
    rows = []
    for baseline, caching in baselines.items():
        key, label = (baseline, "batched", "real"), f"{baseline}: {note}" if note else baseline
        if key in value.failed:
            rows += failed_rows(baseline, caching, value.failed[key], common, value.steps)
            continue
        if key not in value.samples:  # the baseline does not replay this scenario (vLLM caching off: a cached one)
            continue
        samples = [s for _, s in sorted(value.samples[key], key=lambda pair: pair[0])]
        work = value.work[key]
        blocks = cell_blocks(work, samples, samples, slice_bounds(work.steps))
        for metric in METRICS:
            est = ratio_of_sums(*blocks[metric])
            status = "ok" if math.isfinite(est.value) else "skipped"
            rows.append(HistoryRow(caching=caching, metric=metric, value=est.value, ci_low=est.low,
                                   ci_high=est.high, status=status, reps=len(samples), steps=work.steps,
                                   how=how(value, label, metric, len(samples)), **common))
        rows += call_rows(value.metered.get(key), label, caching, work.steps, value.plan, common)
    return rows


def call_rows(metered: MeteredReplays | None, baseline: str, caching: str, steps: int, plan: str,
              common: dict) -> list[HistoryRow]:
    """The engine's own calls and the shared rest of the step, each a median with its min-max over metered replays."""
    if metered is None:
        return []
    rows = []
    for metric, est in zip(CALL_METRICS, (metered.engine(), metered.shared()), strict=True):
        status = "ok" if math.isfinite(est.value) else "failed"
        rows.append(HistoryRow(caching=caching, metric=metric, value=est.value, ci_low=est.low, ci_high=est.high,
                               status=status, reps=len(metered.calls), steps=steps,
                               how=f"{baseline}: {UNITS[metric]}, {metered.how()}; {CALLS_HOW}; {plan}", **common))
    return rows


def failed_rows(baseline: str, caching: str, why: str, common: dict, steps: int = 0) -> list[HistoryRow]:
    return [HistoryRow(caching=caching, metric=metric, value=NAN, ci_low=NAN, ci_high=NAN, status="failed", reps=0,
                       steps=steps, how=f"{baseline}: {why}", **common) for metric in METRICS]


def refused_rows(baselines: Mapping[str, str], why: str, common: dict) -> list[HistoryRow]:
    """The rows of a release whose modules did not load: every baseline failed, with why."""
    return [row for baseline, caching in baselines.items() for row in failed_rows(baseline, caching, why, common)]
