"""Two code versions measured in one run (``kvblock-bench ab``), each implementation's two versions replaying
every slice side by side under this checkout's harness; each side's rows in a run folder of its own, NEW/BASE
paired slice by slice. Design: docs/measurement.md#versions."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.base.files import PAIRED_FILE, write_json
from harness.base.interleave import slice_bounds
from harness.base.interrupts import sigterm_interrupts
from harness.base.metrics import TIMED_FIGURES, Work
from harness.base.stats import Estimate
from harness.errors import InputError
from harness.run import metadata, progress
from harness.run.assemble import paired_sides
from harness.run.jobs import ImplInfo, ProbeJob, RegistryJob, execute
from harness.run.lockstep import alternating
from harness.run.matrix import ScenarioPlan
from harness.run.runner import (
    RunConfig,
    RunWriter,
    Shared,
    build_plan,
    calibrate_timers,
    check_config,
    measure_timings,
    processes_of,
    same_trace_rows,
    scenario_trace,
    skip_scenario,
    wall_row,
    worker_limit,
)
from harness.run.workers import CellDied, Pool, WorkerBug, WorkerSpec
from scenarios import Trace

NATIVE_CACHE_ENV = "KVB_NATIVE_CACHE"  # impls/native/toolchain.py's
SIDES = ("BASE", "NEW")
Key = tuple[str, str, str, str]


@dataclass
class Side:
    """One code version of an ``ab`` run: its name, code root ("" this checkout), git ref and commit."""

    name: str
    code: str
    ref: str
    commit: str
    changed: list[str] = field(default_factory=list)  # files that differ from the commit (NEW's working tree)
    infos: dict[str, ImplInfo] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    native_build: dict | None = None
    writer: RunWriter | None = None
    origin: str = ""

    def label(self) -> str:
        """``BASE (origin/main, commit 0123456789ab)``: the side, its ref and commit."""
        return f"{self.name} ({self.ref}, commit {self.commit})"


@dataclass
class AbResult:
    """Both sides' run folders and NEW/BASE of every figure both measured, paired."""

    folders: dict[str, Path]
    paired: dict[Key, Estimate]
    pairs: dict[Key, list[float]] = field(default_factory=dict)  # NEW/BASE of each pair of processes


def resolve_side(pool: Pool, side: Side, names: list[str]) -> None:
    """``side``'s implementations (``names``, else its registry's) described in a worker of its code, or skipped
    with the reason; :class:`InputError` naming the side where its code does not import or cannot run here."""
    key = WorkerSpec("", -1, side.code)
    try:
        found = pool.run(key, RegistryJob())
    except CellDied as died:
        raise InputError(f"{side.label()}: loading its implementations, the worker process {died.reason}") from None
    except WorkerBug as bug:
        raise InputError(f"{side.label()}: its code cannot run under this harness: {bug.last_line()}") from None
    except InputError as exc:  # the version's code does not import, or came from elsewhere
        raise InputError(f"{side.label()}: {exc}") from None
    finally:
        pool.close_worker(key)
    side.native_build = found.native_build
    for name in names or [*found.infos, *found.unavailable]:
        info = found.infos.get(name) or (None if name in found.unavailable else _probe(pool, side, name))
        if info is not None and getattr(info, "import_failed", False):
            raise InputError(f"{side.label()}: {info.reason}")
        if info is not None and info.ok:
            side.infos[name] = info
        else:
            side.skipped[name] = found.unavailable[name] if info is None else info.reason


def _probe(pool: Pool, side: Side, name: str) -> ImplInfo:
    try:
        return pool.run(WorkerSpec(name, 0, side.code), ProbeJob(name))
    except CellDied as died:
        return ImplInfo(name, False, f"loading it, the worker process {died.reason}", import_failed=True)
    except InputError as exc:  # the version's code does not import, or came from elsewhere
        raise InputError(f"{side.label()}: {exc}") from None


def load_sides(pool: Pool, sides: list[Side], names: list[str], bar: progress.Progress,
               origin: Callable[[Side], str]) -> None:
    """Every side's implementations, checked before anything is measured."""
    for side in sides:
        bar.status(f"loading {side.name}'s implementations ({side.ref})")
        resolve_side(pool, side, names)
    if not any(side.infos for side in sides):
        raise InputError("nothing to measure: neither side can load an implementation of the selection")
    check_from_refs(sides)
    for side in sides:
        side.origin = origin(side)


def from_ref(side: Side, info: ImplInfo) -> bool:
    """Whether ``info``'s implementation is ``side``'s version's own code (a harness that does not say: trusted)."""
    source = getattr(info, "source", "")
    return not source or Path(source).is_relative_to(Path(side.code).resolve())


def check_from_refs(sides: list[Side]) -> None:
    """Refuse a run in which no implementation comes from the refs: both sides would be the same code."""
    if any(from_ref(side, info) for side in sides for info in side.infos.values()):
        return
    names = list(dict.fromkeys(name for side in sides for name in side.infos))
    raise InputError(f"no implementation measured comes from the refs compared: {', '.join(names)} would be the same "
                     "code on both sides (the installed kvblock-bench's or the environment's); name a design that "
                     "this repository holds, e.g. --impl mypkg.module:Class")


def _side_meta(side: Side, cfg: RunConfig, shared: Shared, argv: list[str] | None, other: Side) -> dict:
    infos = side.infos
    meta = metadata.collect(argv, described={n: i.described for n, i in infos.items()},
                            natives=[n for n, i in infos.items() if i.native])
    meta.update(native_build=side.native_build, git_commit=side.commit, git_changed_files=side.changed,
                config={k: str(v) for k, v in vars(cfg).items()}, processes=len(shared.pool),
                calibration=shared.calib, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), complete=False,
                skipped_impls=side.skipped,
                ab={"side": side.name, "ref": side.ref, "code": side.code or "this checkout", "code_from": side.origin,
                    "other": {"side": other.name, "ref": other.ref, "commit": other.commit},
                    "order": "each implementation's two versions side by side at every slice, which goes first "
                             "drawn and swapped at the next, the implementations in a drawn order"})
    return meta


def _plans(cfg: RunConfig, sides: list[Side]) -> list[tuple[ScenarioPlan, Trace | None, dict[str, list]]]:
    """Per scenario: the plan of every cell either side measures, the trace (for --trace), each side's cells."""
    per_side = [build_plan(cfg, side.infos) for side in sides]
    out = []
    for parts in zip(*per_side, strict=True):
        cells = {side.code: plan.cells for side, (plan, _) in zip(sides, parts, strict=True)}
        every = list(dict.fromkeys(c for mine in cells.values() for c in mine))
        out.append((replace(parts[-1][0], cells=every), parts[-1][1], cells))
    return out


def share_native_cache() -> None:
    """Both versions' C++ designs build into this checkout's cache (keyed by their source's digest: a version
    whose C++ is unchanged loads the library built already), unless ``KVB_NATIVE_CACHE`` names one."""
    from impls.native import toolchain

    os.environ.setdefault(NATIVE_CACHE_ENV, str(toolchain.cache_root()))


def _units(plan: ScenarioPlan, cells: dict[str, list], reps: int) -> int:
    """Progress units of a scenario: one per cell and repetition of each side."""
    return sum(plan.reps_of(c, reps) for mine in cells.values() for c in mine)


def run_ab(cfg: RunConfig, sides: list[Side], argv: list[str] | None = None,
           origin: Callable[[Side], str] = lambda side: "") -> AbResult:
    """Measure ``sides`` (BASE, NEW) in one run, each side's rows in a run folder of its own under ``cfg.root``."""
    cfg = replace(cfg, paced=False, l1d=False, allocations=False, table_copy=False, memory=False, studies=False)
    check_config(cfg)
    share_native_cache()
    if cfg.sweep:
        raise InputError("--sweep: ab measures named scenarios (or the default matrix), not the scale sweeps")
    bar = progress.Progress(cfg.progress)
    with Pool(processes_of(cfg), execute, cfg.deadline_s) as pool, tempfile.TemporaryDirectory(
            prefix="kvblock-bench-") as spool:
        load_sides(pool, sides, cfg.impls, bar, origin)
        pool.limit = worker_limit(sum(len(s.infos) for s in sides), len(pool))
        plan = _plans(cfg, sides)
        bar.status("calibrating the timers (the compiled timing loop compiles on first use)")
        shared = Shared(calibrate_timers(), {}, pool, bar, Path(spool), cfg)
        for side, other in zip(sides, sides[::-1], strict=True):
            label = "-".join(filter(None, ["ab", side.name.lower(), cfg.label]))
            side.writer = RunWriter(replace(cfg, label=label), _side_meta(side, cfg, shared, argv, other))
        bar.start(sum(_units(p, cells, cfg.reps) for p, _, cells in plan))
        paired: dict[Key, Estimate] = {}
        pairs: dict[Key, list[float]] = {}
        try:
            with sigterm_interrupts():
                _measure(plan, shared, sides, (paired, pairs))
            for side in sides:
                side.writer.finish(complete=True)
        except KeyboardInterrupt as exc:
            for side in sides:
                side.writer.interrupted(exc)
            print("\ninterrupted: each side's run folder keeps every finished scenario", file=sys.stderr)
            raise
        except BaseException:
            for side in sides:
                side.writer.finish()
            raise
        finally:
            bar.close()
    return AbResult({s.name: s.writer.run_dir for s in sides if s.writer.run_dir is not None}, paired, pairs)


def _measure(plan: list, shared: Shared, sides: list[Side],
             found: tuple[dict[Key, Estimate], dict[Key, list[float]]]) -> None:
    """Every scenario of the plan: both sides' cells in one lockstep, each side's rows written as it goes."""
    paired, pairs = found
    seen: dict[str, str] = {}
    order = alternating([side.code for side in sides])
    for scenario_plan, given, cells in plan:
        sc, trace_rows = scenario_trace(scenario_plan, given, shared)
        name, checksum, trace = sc.scenario, sc.digest, sc.trace
        for side in sides:
            side.writer.meta.setdefault("traces", {})[name] = checksum
        if checksum in seen:
            for side in sides:
                side.writer.add(trace_rows + same_trace_rows(side.writer, name, seen[checksum]))
            for done in (paired, pairs):
                done.update({(name, *key[1:]): value for key, value in done.items() if key[0] == seen[checksum]})
            skip_scenario(shared.bar, sc, seen[checksum], _units(scenario_plan, cells, shared.cfg.reps), 1.0)
            continue
        seen[checksum] = name
        measured = measure_timings(sc, shared, cells, order)
        merged = {code: m for code, (m, _, _) in measured.items()}
        base, new = (merged[side.code] for side in sides)
        each: dict = {}
        paired.update(paired_sides(name, Work.of_trace(trace), slice_bounds(trace.num_steps), base, new,
                                   TIMED_FIGURES, processes=len(shared.pool), pairs=each))
        pairs.update({key: [float(x) for x in ratios] for key, ratios in each.items()})
        wall = wall_row(sc)
        for side in sides:
            _, rows, raw = measured[side.code]
            side.writer.add([*trace_rows, *rows, wall], raw)
        write_paired(sides, paired, pairs)
        shared.bar.scenario_done(name, wall.value)


def write_paired(sides: list[Side], paired: dict[Key, Estimate], pairs: dict[Key, list[float]]) -> None:
    """NEW's ``ab.json``: both sides and NEW/BASE of every figure, paired, and of each of its pairs of processes."""
    new = sides[-1]
    doc = {"sides": {s.name: {"run_id": s.writer.run_dir.name if s.writer.run_dir else None, "ref": s.ref,
                              "commit": s.commit} for s in sides},
           "paired": [{"scenario": k[0], "impl": k[1], "regime": k[2], "metric": k[3], "ratio": e.value,
                       "ci_low": e.low, "ci_high": e.high, "pairs": pairs.get(k, [])} for k, e in paired.items()]}
    write_json(new.writer.folder() / PAIRED_FILE, doc)
