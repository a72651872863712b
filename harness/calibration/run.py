"""``kvblock-bench calibrate``: our contenders beside the engine's own code, on the same traces.
Design: docs/output.md#harnesscalibrationrunpy."""

from __future__ import annotations

import gzip
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness.base.drivers import is_native
from harness.base.host import cpu_identity, machine_name
from harness.base.interleave import SLICES_PER_REP, Key, slice_bounds
from harness.base.metrics import cell_blocks, step_ns_lists
from harness.base.stats import paired_ratio, ratio_of_sums
from harness.calibration.destination import Destination
from harness.calibration.replays import IMPORTING, BaselineInfo, CalibrationJob, Measured, Refused, execute
from harness.calibration.table import CalibrationRow, write_rows
from harness.engines import fetch
from harness.engines.call_meter import call_columns, calls_how, merge_metered
from harness.engines.catalog import Engine
from harness.errors import InputError
from harness.run.metadata import cache_sizes, versions
from harness.run.workers import DEFAULT_DEADLINE_S, CellDied, Pool, WorkerBug
from impls import REGISTRY
from scenarios import SCENARIOS
from scenarios.files.atomic import atomic_write_bytes


@dataclass
class Options:
    engine: Engine
    version: str | None
    scenarios: list[str]
    params: dict[str, dict[str, str]]
    reps: int = 5
    cache: Path = field(default_factory=fetch.default_cache)
    source: Path | None = None
    find_links: Path | None = None
    destination: Destination = field(default_factory=lambda: Destination(None))
    processes: int = 0  # worker processes the repetitions spread over (0: one per repetition)
    deadline_s: float = DEFAULT_DEADLINE_S
    command: str = ""
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)


@dataclass
class Outcome:
    rows: list[CalibrationRow] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    written: Path | None = None
    folder: Path | None = None
    processes: int = 0


def engine_code(opts: Options) -> fetch.EngineCode:
    """The engine's code: the named source folder, else its published wheel (the cache outside the repository)."""
    e = opts.engine
    if opts.source is not None:
        if e.binaries:
            raise InputError(f"--source: {e.name}'s block manager is compiled code; calibrate its published wheel "
                             f"(leave --source out, e.g. {e.name}=={e.wheels(None)[0]})")
        return fetch.source_folder(opts.source, e.packages, opts.version)
    if e.distribution is None:
        raise InputError(f"{e.name} is not published on the package index: give its source folder with --source "
                         f"DIR (e.g. a checkout of its repository)")
    return e.published(opts.version, fetch.outside_repository(opts.cache, "--cache"), opts.find_links)


def calibrate(opts: Options) -> Outcome:
    """Fetch, replay in worker processes, compare; each scenario's rows merged into the table when it is done."""
    for name in opts.scenarios:
        SCENARIOS[name].params(opts.params.get(name, {}))
    opts.destination.check()
    code = engine_code(opts)
    if code.repaired:
        opts.progress(f"the cached files of {code.origin} differed from the wheel ({', '.join(code.repaired[:3])}"
                      f"{', ...' * (len(code.repaired) > 3)}): unpacked again")
    opts.progress(f"{opts.engine.label} {code.version} ({code.digest[:19]}...) from {code.origin}")
    outcome = Outcome()
    with Pool(min(opts.processes or opts.reps, opts.reps), execute, opts.deadline_s) as pool:
        outcome.processes = len(pool)
        for name in opts.scenarios:
            context = Context(opts, code, name)
            rows = context.measure(pool, outcome.failures)
            context.write_raw(opts.destination.runs())
            outcome.folder = opts.destination.where()
            if rows:  # written after each scenario: an interrupted run keeps what finished
                outcome.rows += rows
                outcome.written = write_rows(opts.destination.csv(), rows, opts.engine.label, {name})
    return outcome


REGIMES_HOW = {"batched": "one decode_step per step", "per-call": "append_slot then last_slot per sequence"}


class Context:
    """One scenario of one calibration, in the main process: the workers' jobs, their samples merged, the rows."""

    def __init__(self, opts: Options, code: fetch.EngineCode, name: str) -> None:
        self.opts, self.code, self.name = opts, code, name
        self.failed: dict[Key, str] = {}
        self.parts: list[Measured] = []
        self.samples: dict[Key, list] = {}
        self.load: list[float] = []
        self.metered: dict = {}

    def job(self, only: list[int]) -> CalibrationJob:
        return CalibrationJob(self.opts.engine.name, str(self.code.root), self.code.version, self.name,
                              self.opts.params.get(self.name, {}), self.opts.reps, only)

    def measure(self, pool: Pool, failures: list[str]) -> list[CalibrationRow]:
        """Each worker replays its share of the repetitions (one each by default); the rows come from all."""
        self.load.append(os.getloadavg()[0])
        for w in range(len(pool)):
            only = list(range(w, self.opts.reps, len(pool)))
            part = self.supervised(pool, w, self.job(only))
            self.parts.append(part)
            self.opts.progress(f"{self.name}: repetition{'s' * (len(only) > 1)} {', '.join(str(r + 1) for r in only)}"
                               f" of {self.opts.reps} done in worker process {w + 1} of {len(pool)} "
                               f"({len(part.work)} replays, {part.steps} steps)")
        self.load.append(os.getloadavg()[0])
        failures += [f"{self.name}: {k[0]} ({'the engine' if k[2] else 'ours'}, {k[1]}): {why}"
                     for k, why in self.merge().items()]
        return [row for b in self.parts[0].baselines for row in self.rows_of(b)]

    def merge(self) -> dict[Key, str]:
        """The workers' parts in one: each replay's samples in repetition order, the engine calls; the failures."""
        for part in self.parts:
            self.failed.update(part.failed)
        self.metered = merge_metered([part.metered for part in self.parts])
        for key in dict.fromkeys(k for part in self.parts for k in part.samples):
            if key not in self.failed:
                self.samples[key] = [s for _, s in sorted(r for part in self.parts for r in part.samples.get(key, []))]
        return self.failed

    def supervised(self, pool: Pool, w: int, job: CalibrationJob) -> Measured:
        """``job``'s result from worker ``w``, rerun without a replay each time its worker dies or hangs in it."""
        while True:
            try:
                result = pool.run(w, replace(job, skip=list(self.failed)))
            except CellDied as died:
                if died.cell == IMPORTING:
                    raise InputError(f"{self.opts.engine.name} {self.code.version}: the worker process importing "
                                     f"its modules {died.reason}") from None
                if died.cell is None or len(died.cell) != 3:
                    raise WorkerBug(str(died)) from None
                self.failed[tuple(died.cell)] = f"its worker process {died.reason}"
                continue
            if isinstance(result, Refused):
                raise InputError(result.message)
            return result

    def rows_of(self, b: BaselineInfo) -> list[CalibrationRow]:
        """A row per contender and regime: ours[regime] paired with the engine's code replayed in the same regime."""
        rows = []
        for contender in b.calibrates:
            for regime in self.opts.engine.regimes.get(contender, ()):
                key, real_key = (contender, regime, ""), (b.name, regime, "real")
                if key not in self.samples or real_key not in self.samples:
                    continue
                real_time, real_work = self.blocks(real_key)
                real = ratio_of_sums(real_time, real_work)
                ours_time, ours_work = self.blocks(key)
                ours = ratio_of_sums(ours_time, ours_work)
                ratio = paired_ratio(ours_time, real_time, ours_work, real_work)
                calls = self.metered.get(key), self.metered.get(real_key)
                rows.append(self.row(b, contender, regime, ours, real, ratio, int(ours_work.sum()), calls))
        return rows

    def blocks(self, key: Key):
        work = next(part.work[key] for part in self.parts if key in part.work)
        slices = slice_bounds(work.steps)
        return cell_blocks(work, self.samples[key], self.samples[key], slices)["seq_step_ns"]

    def threads(self) -> str:
        found = [part.threads for part in self.parts if part.threads is not None]
        return str(max(found)) if found else "torch not loaded"

    def row(self, b: BaselineInfo, contender: str, regime: str, ours, real, ratio, seq_steps: int,
            calls: tuple = (None, None)) -> CalibrationRow:
        reps = len(self.samples[(contender, regime, "")])
        processes = len({part.pid for part in self.parts})
        ours_how = (f"{regime} regime, the whole replay inside C++ (one foreign call per slice, each step timed "
                    "there)" if regime == "batched" and is_native(REGISTRY.get(contender, object)) else
                    f"{regime} regime of the harness's Python driver (run_interpreted)")
        how = (f"ours: {contender}, {ours_how}; real: {b.how}; "
               + (f"{b.real_trace_how}; " if b.real_trace_how else "")
               + f"the engine's code through the {regime} regime of the same driver ({REGIMES_HOW[regime]}, turned "
               "by the adapter into the engine's own calls, after the contract's checks our contenders make); both "
               "replays checked against their trace "
               f"(answers, copy-on-writes, slot mapping, end state); {reps} repetitions interleaved in "
               f"{SLICES_PER_REP} slices each, spread over {processes} worker processes (the intervals include the "
               "variation between processes); ns per seq-step = whole step time (per-step medians over "
               f"repetitions) / seq-steps; 95 % paired bootstrap intervals; {calls_how(*calls)}; "
               f"{self.parts[0].plan}")
        e = self.opts.engine
        return CalibrationRow(
            contender=contender, engine=e.label, engine_version=self.code.version, scenario=self.name,
            call_shape=regime, real_call_shape=regime, baseline=b.name, modelled=contender in b.modelled_by,
            ours_ns_per_seq_step=ours.value, ours_low=ours.low, ours_high=ours.high,
            real_ns_per_seq_step=real.value, real_low=real.low, real_high=real.high,
            ratio=ratio.value, ratio_low=ratio.low, ratio_high=ratio.high,
            reps=reps, steps=self.parts[0].steps, seq_steps=seq_steps, package_digest=self.code.digest,
            torch_threads=self.threads(), machine=machine(), load="-".join(f"{x:.2f}" for x in self.load),
            made=time.strftime("%Y-%m-%dT%H:%M:%S%z"), command=self.opts.command, how=how, **call_columns(*calls))

    def write_raw(self, folder: Path) -> None:
        """Per-repetition step times of every replay and its worker (``runs/ENGINE__SCENARIO.json.gz``)."""
        e, first = self.opts.engine, self.parts[0]
        pids = {r: part.pid for part in self.parts for k in part.samples.values() for r, _ in k}
        data = {
            "engine": e.label, "version": self.code.version, "digest": self.code.digest, "origin": self.code.origin,
            "scenario": self.name, "params": self.opts.params.get(self.name, {}), "command": self.opts.command,
            "plan": first.plan, "modules_imported": list(dict.fromkeys(m for p in self.parts for m in p.loaded)),
            "machine": machine(), "versions": versions(), "torch_threads": self.threads(), "load": self.load,
            "worker_pid_of_repetition": {str(r): pid for r, pid in sorted(pids.items())},
            "failed": {" | ".join(k): v for k, v in self.failed.items()},
            "step_ns": {" | ".join(k): step_ns_lists(v) for k, v in self.samples.items()},
            "seq_steps_per_step": next(iter(first.work.values())).seq_steps_per_step.tolist() if first.work else [],
            "metered_engine_calls": {" | ".join(k): asdict(m) for k, m in self.metered.items()},
        }
        name = f"{e.name}__{self.name}.json.gz"
        atomic_write_bytes(folder / name, gzip.compress(json.dumps(data).encode(), mtime=0))


def machine() -> str:
    """This machine named precisely (``host.machine_name``), its system and the software that runs the replays."""
    v = versions()
    return (f"{machine_name({'cpu': cpu_identity(), 'caches': cache_sizes()})}, {platform.system()} "
            f"{platform.release()}, Python {v['python']}, NumPy {v['numpy']}, torch {v['torch']}")
