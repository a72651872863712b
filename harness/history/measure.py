"""``kvblock-bench history``: an engine's block manager, release by release, on the same traces in one run.
Design: docs/output.md#harnesshistorymeasurepy."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.base.args import DEFAULT_DEADLINE_S
from harness.base.files import RESULTS_DIR, new_run_dir, read_json, write_json
from harness.base.interrupts import signal_name
from harness.base.metrics import step_ns_lists
from harness.calibration.replays import IMPORTING, CalibrationJob, Measured, Refused, execute
from harness.calibration.run import machine
from harness.engines import fetch
from harness.engines.catalog import HISTORY_ENGINES, Engine, or_list
from harness.errors import InputError
from harness.history.groups import DEFAULT_GROUP, GroupPlan, anchor_for, next_group, workers_that_fit
from harness.history.records import HISTORY_CSV, HistoryRow, raw_path, write_history
from harness.history.release_figures import measured_rows, refused_rows
from harness.history.releases import resolve
from harness.run.lockstep import lockstep
from harness.run.metadata import collect, load_average
from harness.run.workers import CellDied, Pool, WorkerBug, memory_available
from scenarios import SCENARIOS
from scenarios.files.atomic import atomic_write_bytes

PROGRESS_S = 30.0


@dataclass
class HistoryOptions:
    engine: Engine
    versions: str
    scenarios: list[str]
    params: dict[str, dict[str, str]]
    out: Path | None = None  # None: a new folder results/<timestamp>-history-ENGINE/
    reps: int = 5
    cache: Path = field(default_factory=fetch.default_cache)
    find_links: Path | None = None
    deadline_s: float = DEFAULT_DEADLINE_S
    group: int = DEFAULT_GROUP
    anchor: str | None = None
    command: str = ""
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)


@dataclass
class Release:
    """A release's code in the cache, and the disk it takes there (wheel and unpacked files)."""

    version: str
    code: fetch.EngineCode
    disk: int


@dataclass
class HistoryOutcome:
    rows: list[HistoryRow] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    written: Path | None = None
    seconds: float = 0.0


def check(opts: HistoryOptions) -> list[str]:
    """Everything about the input, before anything is fetched: the releases VERSIONS names, each one drivable."""
    e = opts.engine
    if e.distribution is None or not e.history:
        raise InputError(f"history: {e.name} has no published releases to compare; give "
                         f"{or_list(HISTORY_ENGINES)}")
    for name in opts.scenarios:
        SCENARIOS[name].params(opts.params.get(name, {}))
    fetch.outside_repository(opts.cache, "--cache")
    if opts.out is not None:
        check_out(opts.out)
    versions = resolve(opts.versions, e.distribution, opts.find_links)
    if not versions:
        raise InputError(f"VERSIONS {opts.versions}: no published {e.distribution} release lies in that range")
    era = e.code().era
    for version in versions:
        era(version)
    anchor_for(versions, opts.group, opts.anchor)
    return versions


def check_out(out: Path) -> None:
    """Refuse an ``--out`` folder holding a history: one run's rows never merge into, or replace, another's."""
    held = out / HISTORY_CSV
    if held.exists():
        raise InputError(f"--out {out}: holds a history already ({held}); its rows would be lost or mixed with "
                         "another run's: give a new folder, or move that one's history.csv away first")


def history(opts: HistoryOptions) -> HistoryOutcome:
    """Fetch every release, replay each scenario on all of them in lockstep, write ``history.csv`` and ``meta.json``."""
    started = time.monotonic()
    versions = check(opts)
    made = opts.out is None or not opts.out.exists()
    if opts.out is None:
        opts.out = new_run_dir(RESULTS_DIR, f"history-{opts.engine.name}")
    opts.out.mkdir(parents=True, exist_ok=True)
    try:
        return _measure(opts, versions, started)
    except KeyboardInterrupt as exc:
        _interrupted(opts.out, made, exc)
        raise


def _interrupted(out: Path, made: bool, exc: KeyboardInterrupt) -> None:
    meta_path = out / "meta.json"
    if (out / HISTORY_CSV).is_file() and meta_path.is_file():
        write_json(meta_path, {**read_json(meta_path), "interrupted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "interrupted_by": signal_name(exc)})
    elif made:
        shutil.rmtree(out, ignore_errors=True)


def _measure(opts: HistoryOptions, versions: list[str], started: float) -> HistoryOutcome:
    outcome = HistoryOutcome(releases=[fetched(opts, v) for v in versions])
    disk = sum(r.disk for r in outcome.releases)
    opts.progress(f"{len(versions)} releases in the cache {opts.cache}: {disk / 1e6:,.0f} MB")
    meta = _meta(opts, outcome.releases)
    plan = GroupPlan(opts.group, anchor_for(versions, opts.group, opts.anchor))
    by_version = {r.version: r for r in outcome.releases}
    pending, peak = list(versions), 0
    while pending:
        available = memory_available()
        group = next_group(pending, plan, workers_that_fit(peak, available))
        number = len(meta["groups"]) + 1
        record = {"group": number, "releases": group, "memory_available_bytes": available, "peak_rss_bytes": {}}
        meta["groups"].append(record)
        opts.progress(_group_line(number, group, plan, pending, available, peak))
        with Pool(len(group), execute, opts.deadline_s) as pool:
            for name in opts.scenarios:
                measured = Scenario(opts, [by_version[v] for v in group], name, number)
                rows, load = measured.measure(pool, outcome.failures)
                outcome.rows += rows
                _note(meta, record, name, load, measured.peaks())
                outcome.written = write_history(opts.out / HISTORY_CSV, outcome.rows)
                write_json(opts.out / "meta.json", {**meta, "complete": False})
        peak = max([peak, *record["peak_rss_bytes"].values()])
        opts.progress(_memory_line(number, record))
        pending = [v for v in pending if v not in group]
    outcome.seconds = time.monotonic() - started
    meta["seconds"] = round(outcome.seconds, 1)
    write_json(opts.out / "meta.json", {**meta, "complete": True})
    return outcome


def _note(meta: dict, record: dict, scenario: str, load: list[float], peaks: dict[str, int]) -> None:
    seen = meta["load_average_by_scenario"].get(scenario, []) + load
    meta["load_average_by_scenario"][scenario] = [min(seen), max(seen)] if len(seen) > 2 else seen
    record.setdefault("load_average_by_scenario", {})[scenario] = load
    for version, rss in peaks.items():
        record["peak_rss_bytes"][version] = max(rss, record["peak_rss_bytes"].get(version, 0))


def _group_line(number: int, group: list[str], plan: GroupPlan, pending: list[str], available: int,
                peak: int) -> str:
    left = len([v for v in pending if v not in group])
    bound = (f"; {available / 2**30:,.1f} GiB available, a worker's peak so far {peak / 2**20:,.0f} MiB"
             if peak else "")
    anchor = f", the anchor {plan.anchor} in every group" if left or number > 1 else ""
    return f"group {number}: {len(group)} releases ({group[0]} to {group[-1]}){anchor}, {left} left after it{bound}"


def _memory_line(number: int, record: dict) -> str:
    rss = record["peak_rss_bytes"].values()
    if not rss:
        return f"group {number}: no worker reported its memory"
    return (f"group {number}: peak resident memory per worker {min(rss) / 2**20:,.0f}-{max(rss) / 2**20:,.0f} MiB, "
            f"{sum(rss) / 2**30:,.2f} GiB for its {len(rss)} workers together")


def fetched(opts: HistoryOptions, version: str) -> Release:
    """``version``'s wheel fetched into the cache (reused when there) and unpacked."""
    e = opts.engine
    code = e.published(version, fetch.outside_repository(opts.cache, "--cache"), opts.find_links)
    size = sum(w.stat().st_size for w in code.wheels if w.is_file()) + sum(
        p.stat().st_size for p in Path(code.root).rglob("*") if p.is_file())
    opts.progress(f"{e.label} {code.version} ({code.digest[:19]}...): {code.origin}, {size / 1e6:,.0f} MB in the cache")
    return Release(version, code, size)


def _meta(opts: HistoryOptions, releases: list[Release]) -> dict:
    """The run's machine, software and command, and each release's wheel, digest, plan era and disk."""
    era = opts.engine.code().era
    return {**collect(), "machine": machine(), "command": opts.command, "engine": opts.engine.name,
            "scenarios": opts.scenarios, "params": opts.params, "reps": opts.reps, "cache": str(opts.cache),
            "releases": [{"version": r.version, "digest": r.code.digest, "wheel": r.code.origin, "disk_bytes": r.disk,
                          "era": f"{era(r.version).first}..{era(r.version).last}"} for r in releases],
            "cache_disk_bytes": sum(r.disk for r in releases), "load_average_by_scenario": {},
            "group_size": opts.group, "anchor": anchor_for([r.version for r in releases], opts.group, opts.anchor),
            "groups": []}


class Scenario:
    """One scenario on every release: one worker per release, in lockstep; again without a replay that died."""

    def __init__(self, opts: HistoryOptions, releases: list[Release], name: str, group: int = 1) -> None:
        self.opts, self.releases, self.name, self.group = opts, releases, name, group
        self.failed: dict[str, dict[tuple, str]] = {r.version: {} for r in releases}
        self.results: dict[str, Measured | Refused] = {}

    def spec(self, release: Release) -> tuple[str, str]:
        """The release's worker key: a process of its own, running this checkout (the job imports the release)."""
        return "release", f"{self.opts.engine.name}=={release.version}"

    def job(self, release: Release) -> CalibrationJob:
        o = self.opts
        return CalibrationJob(o.engine.name, str(release.code.root), release.version, self.name,
                              o.params.get(self.name, {}), o.reps, list(range(o.reps)),
                              skip=list(self.failed[release.version]), contenders=False,
                              baselines=tuple(o.engine.history), lockstep=True)

    def measure(self, pool: Pool, failures: list[str]) -> tuple[list[HistoryRow], list[float]]:
        load = [load_average()[0]]
        started = time.monotonic()
        pending = list(self.releases)
        while pending:
            outcome = lockstep(pool, {self.spec(r): self.job(r) for r in pending}, on_position=self.progress(started))
            pending = [r for r in pending if not self.settle(r, outcome[self.spec(r)], pool)]
        load.append(load_average()[0])
        self.opts.progress(f"{self.name}: {len(self.releases)} releases replayed in lockstep, {self.opts.reps} "
                           f"repetitions each, in {time.monotonic() - started:,.0f} s")
        rows = []
        for r in self.releases:
            rows += self.rows_of(r, load, failures)
        self.write_raw()
        return rows, load

    def progress(self, started: float) -> Callable[[tuple], None]:
        last = [time.monotonic()]

        def line(position: tuple) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_S or len(position) != 3:
                return
            last[0] = now
            kind, rep, where = position
            what = (f"metered replay {rep + 1}" if kind == 2 else
                    f"repetition {rep + 1} of {self.opts.reps}, slice {where + 1}")
            self.opts.progress(f"{self.name}, group {self.group} ({len(self.releases)} releases): {what}, "
                               f"{now - started:,.0f} s")

        return line

    def settle(self, release: Release, value: object, pool: Pool) -> bool:
        """Keep ``value`` (True), or note the replay its worker died in to measure the release again (False)."""
        if isinstance(value, WorkerBug):
            raise value
        if isinstance(value, CellDied):
            pool.close_worker(self.spec(release))
            if value.cell is None or tuple(value.cell) == IMPORTING or len(value.cell) != 3:
                self.results[release.version] = Refused(f"{self.opts.engine.name} {release.version}: its worker "
                                                        f"process {value.reason}")
                return True
            self.failed[release.version][tuple(value.cell)] = f"its worker process {value.reason}"
            return False
        self.results[release.version] = value
        return True

    def rows_of(self, release: Release, load: list[float], failures: list[str]) -> list[HistoryRow]:
        value = self.results[release.version]
        common = {"engine": self.opts.engine.name, "version": release.version, "scenario": self.name,
                  "digest": release.code.digest, "machine": machine(), "command": self.opts.command,
                  "load": "-".join(f"{x:.2f}" for x in load), "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "group": self.group}
        if isinstance(value, Refused):
            failures.append(value.message)
            return refused_rows(self.opts.engine.history, value.message, common)
        value.failed.update(self.failed[release.version])
        failures += [f"{self.name}: {self.opts.engine.name} {release.version} {k[0]}: {why}"
                     for k, why in value.failed.items() if k[0] in self.opts.engine.history]
        return measured_rows(value, self.opts.engine.history, common, self.opts.engine.history_how)

    def peaks(self) -> dict[str, int]:
        return {v: m.peak_rss for v, m in self.results.items() if isinstance(m, Measured) and m.peak_rss}

    def write_raw(self) -> None:
        """Per-repetition step times of every release's replays (``runs/ENGINE-VERSION__SCENARIO.json.gz``)."""
        for version, value in self.results.items():
            if not isinstance(value, Measured):
                continue
            data = {"engine": self.opts.engine.name, "version": version, "scenario": self.name,
                    "params": self.opts.params.get(self.name, {}), "plan": value.plan, "pid": value.pid,
                    "modules_imported": value.loaded, "torch_threads": value.threads,
                    "failed": {" | ".join(k): v for k, v in value.failed.items()},
                    "step_ns": {k[0]: step_ns_lists([s for _, s in sorted(v, key=_rep)])
                                for k, v in value.samples.items()},
                    "caching": dict(self.opts.engine.history),
                    "metered_engine_calls": {k[0]: asdict(m) for k, m in value.metered.items()}}
            path = raw_path(self.opts.out, self.opts.engine.name, version, self.name, self.group)
            atomic_write_bytes(path, gzip.compress(json.dumps(data).encode(), mtime=0))


def _rep(pair: tuple) -> int:
    return pair[0]
