"""``kvblock-bench calibrate``: our contenders beside the engine's own code, on the same traces, in one process.

For each scenario: the trace is generated; every contender the engine's baselines calibrate is replayed in its
regimes, and every baseline (the engine's code behind our contract, :mod:`harness.calibration.engines`) in the
batched regime (one ``decode_step`` per step, which the adapter turns into the engine's own per-step calls),
all by the harness's Python driver (:func:`harness.measure.drivers.run_interpreted`), with the sliced
interleaving of ``kvblock-bench run`` (:func:`harness.measure.interleave.interleaved`) and torch pinned to one
intra-op thread as ``run`` pins it. Every replay is checked against its trace as in ``run`` (answers,
copy-on-writes, slot mapping per step, end state). Each ratio ours / real is taken over the same slices and
repetitions (a paired bootstrap, :mod:`harness.measure.stats`).
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.calibration import fetch
from harness.calibration.engines import Baseline, Engine
from harness.calibration.loader import PlanError, StubTouched, engine_imports
from harness.calibration.table import CalibrationRow, write_rows
from harness.calibration.traces import FanOutError
from harness.errors import DesignFailure, InputError
from harness.measure.drivers import Prepared
from harness.measure.failures import blamed_on
from harness.measure.interleave import SLICES_PER_REP, Driver, Key, interleaved, slice_bounds
from harness.measure.metrics import Work, cell_blocks
from harness.measure.stats import paired_ratio, ratio_of_sums
from harness.measure.threads import one_intra_op_thread
from harness.output.metadata import cpu_model, versions
from impls import REGISTRY
from impls.contract import supports_prefix_caching
from scenarios import SCENARIOS, Trace, generate
from scenarios.atomic import atomic_write_bytes
from scenarios.trace import trace_uses_caching

WARM_STEPS = 5
FAILURES = (DesignFailure, StubTouched, PlanError, FanOutError)  # a replay that cannot be measured, named


@dataclass
class Options:
    engine: Engine
    version: str | None
    scenarios: list[str]
    params: dict[str, dict[str, str]]  # scenario -> overrides (strings from the command line)
    reps: int = 5
    cache: Path = field(default_factory=fetch.default_cache)
    source: Path | None = None
    find_links: Path | None = None
    out: Path = Path("results") / "calibration" / "calibration.csv"
    command: str = ""
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)


@dataclass
class Outcome:
    rows: list[CalibrationRow] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    written: Path | None = None


def engine_code(opts: Options) -> fetch.EngineCode:
    """The engine's code: the named source folder, else its published wheel (the cache outside the repository)."""
    e = opts.engine
    if opts.source is not None:
        return fetch.source_folder(opts.source, e.packages, opts.version)
    if e.distribution is None:
        raise InputError(f"{e.name} is not published on the package index: give its source folder with --source "
                         f"DIR (e.g. a checkout of its repository)")
    cache = fetch.outside_repository(opts.cache, "--cache")
    return fetch.published(e.distribution, opts.version, e.packages, cache, opts.find_links)


def calibrate(opts: Options) -> Outcome:
    """Fetch, load, replay, compare; each scenario's rows merged into ``opts.out`` when it is done (nothing is
    written for a scenario that measured nothing)."""
    for name in opts.scenarios:  # bad parameters fail here, before a download
        SCENARIOS[name].params(opts.params.get(name, {}))
    code = engine_code(opts)
    opts.progress(f"{opts.engine.label} {code.version} ({code.digest[:19]}...) from {code.origin}")
    outcome = Outcome()
    with missing_packages(opts.engine):
        module = opts.engine.code()  # an engine module may import what the engine needs (torch)
        plan = module.plan()
    with engine_imports(plan, code.root) as imports:
        with missing_packages(opts.engine):
            try:
                ns = module.load()
            except ModuleNotFoundError:
                raise  # missing_packages says which
            except (ImportError, SyntaxError) as exc:  # PlanError included: a newer release imports more
                raise InputError(f"{opts.engine.name} {code.version}: its modules do not load by the import plan "
                                 f"(harness/calibration/{opts.engine.module}.py): {exc}") from None
        baselines = module.baselines(ns, code.version)
        imports.arm()
        for name in opts.scenarios:
            trace = generate(name, **opts.params.get(name, {}))
            context = Context(opts, code, plan.describe(), trace, name)
            rows = context.measure(baselines, outcome.failures)
            context.write_raw(opts.out.parent / "runs", imports.loaded)
            if rows:  # written after each scenario: an interrupted run keeps what finished
                outcome.rows += rows
                outcome.written = write_rows(opts.out, rows, opts.engine.label, {name})
    return outcome


@contextmanager
def missing_packages(engine: Engine) -> Iterator[None]:
    """A package the engine's modules import that is not installed here (torch, for vLLM and SGLang) is the
    user's to install: one line saying which."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] in engine.packages:
            raise InputError(f"{engine.name}: its modules import {exc.name}, which the import plan does not name "
                             f"(harness/calibration/{engine.module}.py)") from None
        hint = " (pip install 'kvblock-bench[torch]')" if exc.name == "torch" else ""
        raise InputError(f"{engine.name}: its block manager needs the package {exc.name!r}, which is not "
                         f"installed here; install it{hint}") from None


class Context:
    """One scenario of one calibration: its drivers, replays and rows."""

    def __init__(self, opts: Options, code: fetch.EngineCode, plan: str, trace: Trace, name: str) -> None:
        self.opts, self.code, self.plan, self.trace, self.name = opts, code, plan, trace, name
        self.prep = Prepared.from_trace(trace)
        self.slices = slice_bounds(self.prep.num_steps)
        self.drivers: dict[Key, Driver] = {}
        self.failed: dict[Key, str] = {}
        self.samples: dict[Key, list] = {}
        self.load: list[float] = []
        self.threads: int | None = None

    # -- what is replayed --------------------------------------------------------------------------------------
    def contenders(self, baselines: list[Baseline]) -> list[str]:
        caching = trace_uses_caching(self.trace)
        names = dict.fromkeys(c for b in baselines for c in b.calibrates)
        return [c for c in names if c in REGISTRY and (not caching or supports_prefix_caching(REGISTRY[c]))]

    def build(self, baselines: list[Baseline]) -> None:
        real_preps: dict[object, Prepared] = {}
        for contender in self.contenders(baselines):
            for regime in self.opts.engine.regimes.get(contender, ("per-call", "batched")):
                self.drivers[(contender, regime, "")] = Driver(self.prep, REGISTRY[contender], regime, {}, contender)
        for b in baselines:
            key = (b.name, "batched", "real")
            try:
                if b.real_trace not in real_preps:
                    real = self.trace if b.real_trace is None else b.real_trace(self.trace)
                    real_preps[b.real_trace] = self.prep if real is self.trace else Prepared.from_trace(real)
            except FanOutError as exc:
                self.failed[key] = f"{type(exc).__name__}: {exc}"
                continue
            self.drivers[key] = Driver(real_preps[b.real_trace], b.cls, "batched", {}, b.name)

    def warm_up(self) -> None:
        """A few steps on a fresh manager, untimed: first calls, and an early stop for a replay that cannot run."""
        for key, driver in list(self.drivers.items()):
            try:
                with blamed_on(key[0], driver.cls):  # the engine's code runs through its adapter class
                    driver.advance(driver.new())(0, min(WARM_STEPS, self.prep.num_steps))
            except FAILURES as exc:
                self.failed[key] = getattr(exc, "reason", f"{type(exc).__name__}: {exc}")
                del self.drivers[key]

    def measure(self, baselines: list[Baseline], failures: list[str]) -> list[CalibrationRow]:
        baselines = [b for b in baselines if b.replays(self.trace)]
        self.build(baselines)
        self.load.append(os.getloadavg()[0])
        done = [0]

        def tick(key: Key) -> None:
            done[0] += 1
            if done[0] % len(self.drivers) == 0:
                self.opts.progress(f"{self.name}: repetition {done[0] // len(self.drivers)} of {self.opts.reps}")

        with one_intra_op_thread() as threads:
            self.threads = threads
            self.warm_up()
            self.opts.progress(f"{self.name}: {len(self.drivers)} replays x {self.opts.reps} repetitions, "
                               f"{self.prep.num_steps} steps in {len(self.slices)} slices")
            try:
                replays = interleaved(self.drivers, self.opts.reps, False, self.slices, tick) if self.drivers else None
            except (StubTouched, PlanError) as exc:
                raise RuntimeError(f"{self.name}: the engine's code left the import plan during a replay: {exc}") \
                    from exc
        self.load.append(os.getloadavg()[0])
        if replays is not None:
            self.failed.update({k: e.reason for k, e in replays.failed.items()})
            self.samples = replays.samples
        failures += [f"{self.name}: {k[0]} ({'the engine' if k[2] else 'ours'}, {k[1]}): {why}"
                     for k, why in self.failed.items()]
        return [row for b in baselines for row in self.rows_of(b)]

    # -- figures -------------------------------------------------------------------------------------------
    def rows_of(self, b: Baseline) -> list[CalibrationRow]:
        real_key = (b.name, "batched", "real")
        if real_key not in self.samples:
            return []
        real_time, real_work = self.blocks(real_key)
        real = ratio_of_sums(real_time, real_work)
        rows = []
        for contender in b.calibrates:
            for regime in self.opts.engine.regimes.get(contender, ()):
                key = (contender, regime, "")
                if key not in self.samples:
                    continue
                ours_time, ours_work = self.blocks(key)
                ours = ratio_of_sums(ours_time, ours_work)
                ratio = paired_ratio(ours_time, real_time, ours_work, real_work)
                rows.append(self.row(b, contender, regime, ours, real, ratio, int(ours_work.sum())))
        return rows

    def blocks(self, key: Key):
        prep = self.drivers[key].prep
        return cell_blocks(Work.of(prep), self.samples[key], self.samples[key], self.slices)["seq_step_ns"]

    def row(self, b: Baseline, contender: str, regime: str, ours, real, ratio, seq_steps: int) -> CalibrationRow:
        reps = len(self.samples[(contender, regime, "")])
        how = (f"ours: {contender}, {regime} regime of the harness's Python driver (run_interpreted); real: {b.how}; "
               + (f"{b.real_trace_how}; " if b.real_trace is not None and self.trace_changed(b) else "")
               + "the engine's code through the batched regime of the same driver (one decode_step per step, "
               "turned by the adapter into the engine's own calls); both replays checked against their trace "
               f"(answers, copy-on-writes, slot mapping, end state); {reps} repetitions interleaved in "
               f"{SLICES_PER_REP} slices each; ns per seq-step = whole step time (per-step medians over repetitions) "
               f"/ seq-steps; 95 % paired bootstrap intervals; {self.plan}")
        e = self.opts.engine
        return CalibrationRow(
            contender=contender, engine=e.label, engine_version=self.code.version, scenario=self.name,
            call_shape=regime, baseline=b.name, modelled=contender in b.modelled_by,
            ours_ns_per_seq_step=ours.value, ours_low=ours.low, ours_high=ours.high,
            real_ns_per_seq_step=real.value, real_low=real.low, real_high=real.high,
            ratio=ratio.value, ratio_low=ratio.low, ratio_high=ratio.high,
            reps=reps, steps=self.prep.num_steps, seq_steps=seq_steps, package_digest=self.code.digest,
            torch_threads="torch not loaded" if self.threads is None else str(self.threads),
            machine=machine(), load="-".join(f"{x:.2f}" for x in self.load),
            made=time.strftime("%Y-%m-%dT%H:%M:%S%z"), command=self.opts.command, how=how)

    def trace_changed(self, b: Baseline) -> bool:
        return self.drivers.get((b.name, "batched", "real")) is not None and \
            self.drivers[(b.name, "batched", "real")].prep is not self.prep

    def write_raw(self, folder: Path, loaded: list[str]) -> None:
        """Per-repetition step times of every replay and what was imported how (``runs/ENGINE__SCENARIO.json.gz``):
        what the rows summarise, for a reader who wants the spread."""
        e = self.opts.engine
        data = {
            "engine": e.label, "version": self.code.version, "digest": self.code.digest, "origin": self.code.origin,
            "scenario": self.name, "params": self.opts.params.get(self.name, {}), "command": self.opts.command,
            "plan": self.plan, "modules_imported": loaded, "machine": machine(), "versions": versions(),
            "torch_threads": self.threads, "load": self.load,
            "failed": {" | ".join(k): v for k, v in self.failed.items()},
            "step_ns": {" | ".join(k): [s.step_ns.round().astype(int).tolist() for s in v]
                        for k, v in self.samples.items()},
            "seq_steps_per_step": self.prep.trace.running_per_step().tolist(),
        }
        name = f"{e.name}__{self.name}.json.gz"
        atomic_write_bytes(folder / name, gzip.compress(json.dumps(data).encode(), mtime=0))


def machine() -> str:
    v = versions()
    return (f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
            f"Python {v['python']}, NumPy {v['numpy']}, torch {v['torch']}")
