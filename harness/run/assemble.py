"""A scenario's rows from every worker's samples: the main process's half of a run."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.base.builds import with_build
from harness.base.interleave import Key
from harness.base.metrics import Work, cell_blocks, rep_times, timing_rows
from harness.base.rows import RATIO_METRICS, Row, ratio_metric
from harness.base.stats import Estimate, log_interval, pair_logs, paired_ratio
from harness.base.steptimes import KINDS, StepTimes
from harness.run.cells import CellInfo, TimingResult
from scenarios import Trace
from scenarios.trace import trace_uses_caching

Cell = tuple[str, str]
HIT_METRICS = (("cache_hit_tokens_pct", "hit_tokens", "lookup_tokens", "% of prompt tokens looked up"),
               ("cache_hit_blocks_pct", "hit_blocks", "lookup_blocks", "% of full prompt blocks looked up"))


@dataclass
class Merged:
    """Every worker's share of one scenario, together."""

    steps: dict[Key, list[StepTimes]] = field(default_factory=dict)
    details: dict[Key, list[StepTimes]] = field(default_factory=dict)
    failed: dict[Cell, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    info: dict[Cell, CellInfo] = field(default_factory=dict)
    reps: dict[Key, int] = field(default_factory=dict)
    torch_threads: int | None = None
    pids: dict[str, list[int]] = field(default_factory=dict)  # impl -> its workers' process ids


def merge(results: list[TimingResult], failed: dict[Cell, str]) -> Merged:
    """The workers' results as one, each key's samples in repetition order; failed cells lose their samples."""
    out = Merged(failed=dict(failed))
    for result in results:
        out.failed.update({c: r for c, r in result.failed.items() if c not in out.failed})
        out.rows += result.rows
        out.info.update(result.info)
        if result.torch_threads is not None:
            out.torch_threads = max(out.torch_threads or 0, result.torch_threads)
        for impl in dict.fromkeys(c[0] for c in result.info):
            out.pids.setdefault(impl, []).append(result.pid)
    for name, target in (("steps", out.steps), ("details", out.details)):
        collected: dict[Key, list[tuple[int, StepTimes]]] = {}
        for result in results:
            for key, samples in getattr(result, name).items():
                collected.setdefault(key, []).extend(samples)
        for key, samples in collected.items():
            if key[:2] not in out.failed:
                target[key] = [s for _, s in sorted(samples, key=lambda pair: pair[0])]
                out.reps[key] = len(samples)
    out.rows = [r for r in out.rows if (r.impl, r.regime) not in out.failed]
    return out


class ScenarioRows:
    """The rows of one scenario from :class:`Merged` samples."""

    def __init__(self, scenario: str, trace: Trace, work: Work, slices: list[tuple[int, int]], base: str,
                 calib: dict) -> None:
        self.scenario, self.trace, self.work, self.slices, self.base, self.calib = (scenario, trace, work, slices,
                                                                                   base, calib)
        self.rows: list[Row] = []
        self.raw: dict[str, object] = {}

    def row(self, impl: str, regime: str, metric: str, value: float, unit: str, source: str, how: str = "",
            status: str = "ok", **columns) -> None:
        self.rows.append(Row(self.scenario, impl, regime, metric, value, unit, source, status, how, **columns))

    def build(self, cells: list[Cell], merged: Merged) -> tuple[list[Row], dict[str, object]]:
        """Every row and raw file of the scenario's cells."""
        for cell, reason in merged.failed.items():
            self.row(*cell, "correctness", float("nan"), "", "trace check", reason, status="failed")
        live = [c for c in cells if c not in merged.failed and (*c, "") in merged.steps]
        for cell in live:
            self._cell_rows(cell, merged)
        self.rows += merged.rows
        self._ratio_rows(live, merged)
        self._cache_rows(live)
        self._aa_row(merged)
        return self.rows, self.raw

    def _details(self, key: Key, merged: Merged) -> list[StepTimes]:
        return merged.details.get(key, merged.steps[key])

    def _cell_rows(self, cell: Cell, merged: Merged) -> None:
        key, info = (*cell, ""), merged.info[cell]
        step_samples, detail_samples = merged.steps[key], self._details(key, merged)
        timed = timing_rows((self.scenario, *cell), self.work, step_samples, detail_samples,
                            self.trace.header["params"].get("step_rate", 2000), info.timer_overhead_ns, info.how,
                            self.slices, whole_steps=cell[1] == "step")
        for row in timed:
            row.driver, row.how = info.driver, with_build(row.how, info.build)
        self.rows += timed
        self.raw[f"raw/{self.scenario}/{cell[0]}__{cell[1]}.json.gz"] = {
            "clock": step_samples[0].clock,
            "slices": self.slices,
            "step_ns": [s.step_ns.round(1).tolist() for s in step_samples],
            "kind_ns_totals": [dict(zip(KINDS, s.ns.sum(axis=0).round(1).tolist(), strict=True))
                               for s in detail_samples],
        }

    def _blocks(self, key: Key, merged: Merged):
        return cell_blocks(self.work, merged.steps[key], self._details(key, merged), self.slices)

    def _ratio_rows(self, cells: list[Cell], merged: Merged) -> None:
        """Each cell against the base in the same regime (and against the batched base), paired block by block."""
        for impl, regime in cells:
            mine = self._blocks((impl, regime, ""), merged)
            for base_regime, batched_base in ((regime, False), ("batched", True)):
                base_key = (self.base, base_regime, "")
                if base_key not in merged.steps or base_key == (impl, regime, "") or (
                        batched_base and regime == "batched"):
                    continue
                base = self._blocks(base_key, merged)
                metrics = ("seq_step_ns",) if batched_base or regime == "step" else RATIO_METRICS
                for metric in metrics:
                    self._ratio_row((impl, regime), ratio_metric(metric, self.base, batched_base), mine[metric],
                                    base[metric], merged)

    def _ratio_row(self, cell: Cell, metric: str, mine, base, merged: Merged) -> None:
        if not mine[1].sum() or not base[1].sum():
            return
        est = paired_ratio(mine[0], base[0], mine[1], base[1])
        self.row(*cell, metric, est.value, "x", "ratio",
                 f"time per unit of work over {self.base}'s (each step's median over repetitions); 95 % paired "
                 "bootstrap interval, the same slices and repetitions drawn for both", ci_low=_finite(est.low),
                 ci_high=_finite(est.high), reps=merged.reps[(*cell, "")], steps=self.work.steps,
                 driver=merged.info[cell].driver)

    def _cache_rows(self, cells: list[Cell]) -> None:
        """Hit rates and evictions of a caching trace for every cell whose hits matched the trace's."""
        if not trace_uses_caching(self.trace):
            return
        cache = self.trace.header["cache"]
        evictions = float(self.trace.step_evictions.sum()) / max(1, self.trace.num_steps)
        for impl, regime in cells:
            for metric, hit, looked, what in HIT_METRICS:
                self.row(impl, regime, metric, 100.0 * cache[hit] / max(1, cache[looked]), "%",
                         "trace check", f"{what}; every step's hits checked against the reference model's")
            self.row(impl, regime, "evictions_per_step", evictions, "blocks/step", "trace check",
                     "cached blocks evicted per step (the reference model's, which every replay reproduces)")

    def _aa_row(self, merged: Merged) -> None:
        """The A/A control: the copy's seq-step time over the original's, paired."""
        aa = next((key for key in merged.steps if key[2] == "aa"), None)
        if aa is None or (*aa[:2], "") not in merged.steps:
            return
        orig = merged.steps[(*aa[:2], "")]
        copy = cell_blocks(self.work, merged.steps[aa], merged.steps[aa], self.slices)["seq_step_ns"]
        base = cell_blocks(self.work, orig, orig, self.slices)["seq_step_ns"]
        est = paired_ratio(copy[0], base[0])
        verdict = "no difference" if est.contains(1.0) else "differs: the noise floor of this run"
        self.row(aa[0], aa[1], "aa_ratio", est.value, "x", "ratio",
                 f"A/A control: the same cell replayed twice, interleaved as two cells; seq-step time of the copy "
                 f"over the original; {verdict}", ci_low=_finite(est.low), ci_high=_finite(est.high),
                 reps=merged.reps[aa], steps=self.work.steps, driver=merged.info[aa[:2]].driver)


def _finite(x: float) -> float | None:
    return None if x != x else x


def paired_sides(scenario: str, work: Work, slices: list[tuple[int, int]], base: Merged, new: Merged,
                 metrics: tuple[str, ...] = RATIO_METRICS, processes: int = 0,
                 pairs: dict | None = None) -> dict[tuple[str, str, str, str], Estimate]:
    """NEW over BASE of every cell both sides measured (``kvblock-bench ab``), by ``metrics``: the repetitions of one
    worker process (``r`` modulo ``processes``) of both sides are a pair (``paired_reps``), else the rows' blocks are
    drawn alike (``paired_ratio``); ``pairs`` receives NEW/BASE of each pair (none for the blocks)."""
    out = {}
    pairs = {} if pairs is None else pairs
    for key in new.steps:
        if key[2] or key not in base.steps:
            continue
        mine = rep_times(work, new.steps[key], new.details.get(key, new.steps[key]))
        theirs = rep_times(work, base.steps[key], base.details.get(key, base.steps[key]))
        blocks: list[dict] = []
        for metric in metrics:
            (time_new, per_step), (time_base, _) = mine[metric], theirs[metric]
            if not per_step.sum():
                continue
            figure = (scenario, key[0], key[1], metric)
            if time_new.shape == time_base.shape and time_new.shape[0] >= 2:
                groups = np.arange(time_new.shape[0]) % processes if processes else None
                logs = pair_logs(time_new, time_base, groups=groups)
                out[figure], pairs[figure] = log_interval(logs), np.exp(logs)
            else:
                pairs[figure] = np.array([])
                blocks = blocks or [cell_blocks(work, s.steps[key], s.details.get(key, s.steps[key]), slices)
                                    for s in (new, base)]
                (blocks_new, work_new), (blocks_base, work_base) = blocks[0][metric], blocks[1][metric]
                out[figure] = paired_ratio(blocks_new, blocks_base, work_new, work_base)
    return out
