"""Figures a design cannot bend (issue 36, item 2): through the command line, and the pieces one by one.

A plug-in that patches ``time.perf_counter_ns`` reads what it costs (the drivers' clock was bound before it was
imported); one that patches the harness's own clock name is failed by the supervisor's bound on its timed
regions against its worker's CPU time; one that defines the untimed per-step hook is refused, by ``run`` and by
``check``; one that says it holds one byte is measured by the allocator. Honest designs pass the bound. The
plug-ins: ``tests/faking_plugins.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from harness.base import drivers, hook
from harness.base.drivers import Prepared, run_interpreted
from harness.base.replay import ReplayError
from harness.base.rows import read_rows
from harness.base.steptimes import StepTimes
from harness.run import bound, floor
from harness.run.cells import CellInfo, TimingResult
from impls import REGISTRY, registry
from scenarios import generate

ROOT = Path(__file__).resolve().parents[1]
P = "tests.faking_plugins:"
QUICK = ["--scenario", "paper", "--quick", "--no-l1d", "--no-paced", "--no-table-copy", "--processes", "1",
         "--no-progress"]
BOUND_WORDS = "timed regions claim"
REBOUND_WORDS = "rebound the harness's timing code"  # the sealed names caught it first (issue 57)


def refused(reason: str) -> bool:
    """Whether ``reason`` is one of the two refusals of a faked clock, on one line."""
    return (BOUND_WORDS in reason or REBOUND_WORDS in reason) and "\n" not in reason
linux_only = pytest.mark.skipif(bound.process_cpu_ns(os.getpid()) is None, reason="needs a process CPU clock")


def kvb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    rows: list = field(default_factory=list)

    def failed(self, impl: str) -> dict[str, str]:
        return {r.regime: r.how for r in self.rows if r.impl == impl and r.metric == "correctness"
                and r.status == "failed"}

    def value(self, impl: str, regime: str, metric: str = "seq_step_ns") -> float | None:
        found = [r for r in self.rows if (r.impl, r.regime, r.metric, r.status) == (impl, regime, metric, "ok")]
        return found[0].value if found else None


def run(tmp: Path, impls: str, regimes: str = "per-call,batched,step", *extra: str) -> Run:
    proc = kvb("run", "--impl", impls, "--regime", regimes, *QUICK, "--results", str(tmp), *extra)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    latest = tmp / "latest" / "results.csv"
    return Run(proc, read_rows(latest) if latest.exists() else [])


# -- through the command line ---------------------------------------------------------------------------------
@linux_only
@pytest.mark.slow  # a CLI run each (make test-slow, .ci/run)
def test_a_plugin_patching_perf_counter_reads_what_it_costs(tmp_path) -> None:
    """It runs its clock 1000 times slower; its figures stay within a loose bound of ``dict``'s (the same code,
    measured in a run of its own: a patched clock would slow every cell of its worker), or its cells fail with the
    bound's reason."""
    fake = P + "PatchesPerfCounter"
    honest, got = run(tmp_path / "honest", "dict"), run(tmp_path / "faked", fake)
    for regime in ("per-call", "batched", "step"):
        if regime in got.failed(fake):
            assert refused(got.failed(fake)[regime])
            continue
        reference, faked = honest.value("dict", regime), got.value(fake, regime)
        assert reference and faked and faked > 0.3 * reference, (regime, reference, faked)


@linux_only
@pytest.mark.slow  # a CLI run each (make test-slow, .ci/run)
def test_a_plugin_patching_the_harness_clock_is_failed_by_the_bound(tmp_path) -> None:
    fake = P + "PatchesHarnessClock"
    got = run(tmp_path, f"dict,{fake}")
    failed = got.failed(fake)
    assert set(failed) == {"per-call", "batched", "step"}, got.proc.stderr[-3000:]
    assert all(refused(reason) for reason in failed.values())
    assert got.proc.returncode == 3  # (dict shares its worker, and the patched clock, until item 1's layout)


@linux_only
@pytest.mark.slow  # a CLI run each (make test-slow, .ci/run)
def test_a_plugin_doing_work_in_the_untimed_hook_is_refused_by_run_and_check(tmp_path) -> None:
    fake = P + "WorksInHook"
    got = run(tmp_path, f"dict,{fake}")
    assert set(got.failed(fake)) == {"per-call", "batched", "step"}
    assert all("untimed_after_step" in reason for reason in got.failed(fake).values())
    assert not got.failed("dict") and got.value("dict", "batched")
    check = kvb("check", fake, "--seeds", "1", "--examples", "5")
    assert check.returncode != 0 and "untimed_after_step" in check.stdout + check.stderr
    assert "Traceback" not in check.stderr


@pytest.mark.slow  # a CLI run each (make test-slow, .ci/run)
def test_memory_comes_from_the_allocator_not_from_the_design(tmp_path) -> None:
    """A design with a one-byte ``state`` and ``memory_bytes()`` of 1 measures as what it allocated: ``dict``'s."""
    fake = P + "FakeMemory"
    got = run(tmp_path, f"dict,{fake}", "batched", "--memory")
    honest, faked = got.value("dict", "batched", "memory_bytes"), got.value(fake, "batched", "memory_bytes")
    assert honest and faked and faked > 0.5 * honest, (honest, faked)
    assert {r.source for r in got.rows if r.metric == "memory_bytes"} == {"memray"}


@linux_only
@pytest.mark.slow  # a CLI run each (make test-slow, .ci/run)
def test_honest_designs_pass_the_bound(tmp_path) -> None:
    got = run(tmp_path, "flat,dict,list,vllm-v1")
    assert got.proc.returncode == 0, got.proc.stderr[-3000:]
    assert not [r for r in got.rows if r.status == "failed"]


@linux_only
@pytest.mark.slow  # a CLI run (make test-slow, .ci/run)
def test_an_honest_contender_building_a_large_pool_passes_the_bound_on_a_short_trace(tmp_path) -> None:
    """vllm-v1 builds an object per block of azure-code's 65,536: more CPU than a quick replay claims, and no
    timed region's (constructors run unmarked)."""
    got = run(tmp_path, "vllm-v1", "batched", "--scenario", "azure-code", "--no-allocations")
    assert got.proc.returncode == 0, got.proc.stderr[-3000:]
    assert not [r for r in got.rows if r.status == "failed"] and got.value("vllm-v1", "batched")


# -- the pieces ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trace():
    return generate("paper", steps=30, running=8, num_blocks=512)


def test_the_drivers_clock_was_bound_before_any_design(trace, monkeypatch) -> None:
    monkeypatch.setattr(time, "perf_counter_ns", lambda: 0)  # a stopped clock, patched after the import
    mgr = REGISTRY["dict"](**trace.config)
    times = run_interpreted(Prepared.from_trace(trace), mgr, "batched")
    assert drivers.perf_ns is not time.perf_counter_ns and times.step_ns.min() > 0


def _result(claimed_ns: float, cpu_ns: int, slices: int, driver: str = "python", ran: float | None = None
            ) -> TimingResult:
    ns = np.zeros((10, 5))
    ns[:, 3] = claimed_ns / 10
    times = StepTimes(ns, np.zeros(10, np.int64), ns[:, 3].copy(), 1.0, "perf_counter_ns")
    if ran is not None:
        times.span_ns, times.ran = ns[:, 3].copy(), np.full(10, ran)
    result = TimingResult(steps={("x", "batched", ""): [(0, times)]},
                          info={("x", "batched"): CellInfo(driver, "", 0.0, False)})
    result.supervised = {("x", "batched", ""): (cpu_ns, slices)}
    return result


def _floor(floor_ns: int = 0, claimed: float = 0.0) -> dict[str, float]:
    """The floor per slice from a floor worker's readings: four slices of ``floor_ns`` CPU each."""
    return bound.floor_per_slice({("floor", "batched"): (floor_ns * 4, 4)}, {"batched": claimed} if claimed else {})


def test_the_bound_fails_a_cell_claiming_much_less_than_its_cpu_time() -> None:
    slices, ms = 20, 1_000_000
    assert bound.violations(_result(86 * ms, 100 * ms, slices), _floor()) == {}  # an honest cell
    assert bound.violations(_result(100 * ms, 100 * ms, slices), _floor(3 * ms)) == {}  # most of it the floor's
    for hidden in (0.30, 0.65, 0.99):  # issue 57: a fake of 30 % is caught where the timed work dwarfs the floor
        assert ("x", "batched") in bound.violations(_result(86 * ms * (1 - hidden), 100 * ms, slices), _floor())
    faked = bound.violations(_result(2 * ms, 100 * ms, slices), _floor())
    assert BOUND_WORDS in faked[("x", "batched")] and "\n" not in faked[("x", "batched")]
    assert bound.violations(_result(2 * ms, 100 * ms, slices), _floor(int(3.3 * ms))) == {}  # within the floor
    assert ("x", "batched") in bound.violations(_result(2 * ms, 0, 0), _floor())  # samples of unmarked replays
    unread = _result(2 * ms, 100 * ms, slices)
    unread.supervised = None
    assert bound.violations(unread, _floor()) == {}  # no process clock: nothing bounded


def test_a_preempted_cell_claims_only_the_cpu_it_got() -> None:
    """Beside other work a cell's timed regions hold time its thread was off the CPU: the bound weighs each step by
    the share its thread ran, so a fake cannot hide behind another process's time slices."""
    slices, ms = 20, 1_000_000
    assert bound.violations(_result(200 * ms, 100 * ms, slices, ran=0.45), _floor()) == {}  # 90 ms on the CPU
    assert ("x", "batched") in bound.violations(_result(200 * ms, 100 * ms, slices, ran=0.3), _floor())


def test_a_compiled_cell_whose_state_numba_types_slowly_passes_on_a_short_trace() -> None:
    """The readings of a quick run's list-jit on azure-code (typed lists: Numba types the state in Python at
    every replay call, outside the timed loop) were failed by a slack of 50 us per slice; they pass now."""
    us = 1_000
    result = _result(3_000 * us, int((312 + 1.5 * 114) * us) * 116, 116, driver="compiled")
    assert bound.violations(result, {"compiled": 114 * us}) == {}
    faked = _result(0.0, int((312 + 1.5 * 114) * us) * 116 * 40, 116, driver="compiled")  # a clock stopped
    assert ("x", "batched") in bound.violations(faked, {"compiled": 114 * us})


def test_the_floor_is_the_harness_work_outside_the_do_nothing_designs_timed_regions() -> None:
    ms = 1_000_000
    result = _result(2 * ms, 100 * ms, 20)
    assert bound.violations(result, _floor(int(3.3 * ms))) == {}
    # most of the floor was the do-nothing design's own calls
    assert ("x", "batched") in bound.violations(result, _floor(int(3.3 * ms), claimed=4 * 3.0 * ms))
    assert bound.floor_per_slice(None, {}) == {}  # the floor worker's clock unreadable: no floor


def test_a_cell_without_a_floor_fails_from_python_and_is_not_bounded_compiled() -> None:
    result = _result(2 * 1_000_000, 100 * 1_000_000, 20)
    assert "no floor" in bound.violations(result, {})[("x", "batched")]
    result.info[("x", "batched")] = CellInfo("compiled", "", 0.0, True)
    assert bound.violations(result, {}) == {}


def test_the_bound_leaves_failed_cells_to_their_reason() -> None:
    result = _result(1, 100_000_000, 20)
    result.failed[("x", "batched")] = "its own reason"
    assert bound.violations(result, _floor()) == {}


@linux_only
def test_the_meter_adds_cpu_time_per_marked_key_and_overwrites_what_the_worker_said() -> None:
    meter, pid = bound.Meter(), os.getpid()
    meter.mark(pid, ("a", "batched", ""))
    sum(range(200_000))
    meter.mark(pid, ("b", "batched", ""))
    meter.mark(pid, ("a", "batched", ""))
    meter.mark(pid, None)
    cpu, slices = meter.readings[("a", "batched", "")]
    assert slices == 2 and cpu > 0 and meter.readings[("b", "batched", "")][1] == 1
    result = TimingResult(supervised={("a", "batched", ""): (10**12, 1)})  # what a worker might claim
    assert meter.attach(result).supervised[("a", "batched", "")] == (cpu, 2)
    assert meter.readings == {}


def test_a_meter_without_the_process_clock_bounds_nothing(monkeypatch) -> None:
    monkeypatch.setattr(bound, "process_cpu_ns", lambda pid: None)
    meter = bound.Meter()
    meter.mark(1, ("a", "batched", ""))
    assert meter.attach(TimingResult()).supervised is None


def test_the_untimed_hook_is_only_for_adapters_and_records_that_allow_it(monkeypatch) -> None:
    from harness.engines.adapter import EngineAdapter
    from tests.faking_plugins import WorksInHook

    with pytest.raises(ReplayError, match="untimed_after_step"):
        hook.untimed_hook(WorksInHook(64))
    assert hook.hook_problem(WorksInHook) and not hook.hook_problem(REGISTRY["dict"])

    class Adapter(EngineAdapter):
        def untimed_after_step(self, step: int) -> None:
            pass

    assert hook.untimed_hook(Adapter(64)) is not None
    marked = registry.Impl("hooked", "tests.faking_plugins:WorksInHook", "contender", "", "", "#000000",
                           untimed_hook=True)
    monkeypatch.setattr(registry, "RECORDS", (*registry.RECORDS, marked))
    assert hook.untimed_hook(WorksInHook(64)) is not None


@pytest.mark.parametrize("scenario", ["paper", "beam-search", "shared-prefix", "chat-multiturn"])
def test_the_floor_replays_every_regime_from_the_trace_alone(scenario) -> None:
    """The do-nothing design passes every check of every Python regime (and the end state): its replay is the
    harness's own work; each slice is marked."""
    prep = Prepared.from_trace(generate(scenario, steps=40))
    marks: list = []
    floor.measure_floor(prep, ["per-call", "batched", "step"], marks.append)
    regimes = {m[1] for m in marks if m}
    assert regimes <= {"per-call", "batched", "step"} and {"per-call", "batched"} <= regimes
    assert len([m for m in marks if m is None]) == floor.FLOOR_REPS  # after each repetition's slices


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
@linux_only
def test_a_plugin_faking_its_clock_fails_the_gates_wall_clock_rule_by_the_bound(tmp_path) -> None:
    """Once 82 ns against dict's 1,385, and the rule passed: now the supervisor's reading of the plug-in's CPU time,
    against the do-nothing design's replays in the registered designs' worker, fails it with the reason."""
    fake = P + "PatchesHarnessClock"
    config = tmp_path / "gate.toml"
    config.write_text(f'[tool.kvblock-bench.gate.wall]\nslower = "dict"\nfaster = "{fake}"\nmin_ratio = 1.0\n')
    proc = kvb("gate", "--config", str(config), "--no-callgrind", "--impl", fake)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("FAIL: wall clock")]
    assert line.startswith("FAIL: wall clock") and f"{fake}: " in line and refused(line), line
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_the_gates_wall_clock_rule_passes_honest_designs(tmp_path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text('[tool.kvblock-bench.gate.wall]\nslower = "dict"\nfaster = "flat"\nmin_ratio = 1.0\n')
    proc = kvb("gate", "--config", str(config), "--no-callgrind", "--impl", "dict")
    assert "wall clock, batched step" in proc.stdout and "FAIL" not in proc.stdout, proc.stdout[-3000:] + proc.stderr
    assert proc.returncode == 2 and "gate incomplete" in proc.stdout  # (no instruction counts: --no-callgrind)


@linux_only
@pytest.mark.slow  # a CLI run (make test-slow, .ci/run)
def test_a_plugin_faking_the_paced_cpu_clock_has_its_paced_rows_failed(tmp_path) -> None:
    """Its paced loops would claim a thousandth of the CPU time the supervisor reads: its cell fails (the sealed
    clock names catch it first) and no paced share of it is published; dict's paced share is measured."""
    fake = P + "PatchesThreadClock"
    proc = kvb("run", "--impl", f"dict,{fake}", "--regime", "batched", "--scenario", "paper", "--quick", "--no-l1d",
               "--no-table-copy", "--no-allocations", "--processes", "1", "--no-progress", "--results",
               str(tmp_path))
    rows = read_rows(tmp_path / "latest" / "results.csv")
    shares = {r.impl: r for r in rows if r.metric == "cpu_share_observed_pct"}
    failed = {r.regime: r.how for r in rows if r.impl == fake and r.status == "failed"}
    assert refused(failed.get("batched", "")), proc.stderr[-3000:]
    assert fake not in shares or (shares[fake].status == "failed" and "paced loops claim" in shares[fake].how)
    assert shares["dict"].status == "ok" and shares["dict"].value > 0
    assert proc.returncode == 3 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["Hides30Percent", "Hides65Percent", "Hides99Percent"])
def test_a_design_rebinding_the_timing_code_fails_at_any_share_hidden(name, monkeypatch) -> None:
    """Issue 57: rebinding a module global of the timing code hid 65 % and passed; now every slice checks the
    names sealed before the design loaded, and the Python drivers check the clocks they hold."""
    import tests.faking_plugins as plugins
    from harness.base import clock, interleave

    monkeypatch.setattr(clock, "_SEALED", {})
    clock.seal()
    for module in (drivers, interleave):
        monkeypatch.setattr(module, "perf_ns", module.perf_ns)  # restored after the test
    trace = generate("paper", steps=40, running=8)
    prep = Prepared.from_trace(trace)
    key = (name, "batched", "")
    out = interleave.interleaved({key: interleave.Driver(prep, getattr(plugins, name), "batched", {}, name)},
                                 interleave.Turns(1, interleave.slice_bounds(40, 4)), False)
    assert key in out.failed and "rebound the harness's timing code" in str(out.failed[key])


def test_the_drivers_refuse_a_clock_that_is_not_times_own() -> None:
    from harness.base.clock import genuine

    assert genuine(time.perf_counter_ns, "perf_counter_ns") and genuine(time.thread_time_ns, "thread_time_ns")
    assert not genuine(lambda: 0, "perf_counter_ns") and not genuine(time.monotonic_ns, "perf_counter_ns")
    with pytest.raises(ReplayError, match="rebound the harness's timing code"):
        drivers.check_clocks(lambda: 0, time.thread_time_ns)


def test_paced_loops_claiming_too_little_cpu_or_too_much_wall_time_are_failed() -> None:
    """The paced bound itself (the sealed names now stop a rebound clock before it runs): a thousandth of the CPU
    time read, or more wall time than passed, fails the cell with the reason; honest claims pass."""
    from harness.run.bound import SLACK_NS, paced_violations

    cpu, wall = {("a", "batched", ""): (100_000_000, 10)}, {("a", "batched", ""): 200_000_000}
    assert paced_violations({("a", "batched", ""): (95_000_000, 150_000_000)}, cpu, wall) == {}
    slow_cpu = paced_violations({("a", "batched", ""): (100_000, 150_000_000)}, cpu, wall)
    assert "paced loops claim 0.10 ms of CPU time" in slow_cpu[("a", "batched")]
    fast_wall = paced_violations({("a", "batched", ""): (95_000_000, 200_000_000 + 11 * SLACK_NS)}, cpu, wall)
    assert "more than the" in fast_wall[("a", "batched")]
    assert paced_violations({("a", "batched", ""): (1, 1)}, None, wall) == {}


def test_honest_compiled_cells_of_the_reference_run_pass_and_a_stopped_compiled_clock_fails() -> None:
    """The full reference run at 91fb980 failed honest dict-jit and list-jit cells at 80 % (concurrency-64
    list-jit: 20.27 ms claimed of 90.24 ms beyond the floor); compiled replays are held to COMPILED_FRACTION."""
    ms = 1_000_000
    honest = _result(20.27 * ms, int(90.24 * ms), 20, driver="compiled")
    assert bound.violations(honest, {"compiled": 0.0}) == {}
    assert bound.violations(_result(20.27 * ms, int(90.24 * ms), 20), _floor(0)) != {}  # from Python: failed
    stopped = _result(0.0, int(400 * ms), 20, driver="compiled")
    assert ("x", "batched") in bound.violations(stopped, {"compiled": 0.0})
