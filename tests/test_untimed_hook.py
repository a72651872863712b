"""The Python drivers' untimed per-step hook, ``untimed_after_step(step)`` (harness/base/drivers.py).

Each Python driver calls it once per step, after the step's timed regions and checks, in step order, and none of
its time lands in a timed region: a fake clock that jumps by a second only while the hook runs shows it. A
manager without the hook replays as before. Only calibration adapters and registry records marked for it may
define it (:mod:`harness.base.hook`): the tests' manager is let through by standing in for the rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.base import drivers, hook
from harness.base.drivers import Prepared, run_interpreted, run_whole_steps, step_runner, whole_step_runner
from impls import REGISTRY
from scenarios import generate

JUMP = 10**9  # what the hook adds to the fake clock


class _Clock:
    """perf_counter_ns standing in: one nanosecond per read, and a jump while the hook runs."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1
        return self.now


def _hooked(clock: _Clock) -> type:
    class Hooked(REGISTRY["list"]):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.seen: list[tuple[int, int]] = []  # (step, sequences appended so far)
            self.appends = 0

        def decode_step(self, seq_ids, cow_out, slot_out):
            self.appends += len(seq_ids)
            return super().decode_step(seq_ids, cow_out, slot_out)

        def append_slot(self, seq_id):
            self.appends += 1
            return super().append_slot(seq_id)

        def untimed_after_step(self, step: int) -> None:
            self.seen.append((step, self.appends))
            clock.now += JUMP

    return Hooked


@pytest.fixture(autouse=True)
def _hook_allowed(monkeypatch):
    monkeypatch.setattr(hook, "hook_allowed", lambda cls: True)


@pytest.fixture
def trace():
    return generate("parallel-sampling", steps=12, running=8, num_blocks=512)


def _appended_by(trace) -> list[int]:
    return np.cumsum(trace.running_per_step()).tolist()


@pytest.mark.parametrize("regime", ["per-call", "batched", "step"])
def test_the_timed_drivers_call_the_hook_after_each_step_outside_every_timed_region(trace, regime, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(drivers, "perf_ns", clock)
    monkeypatch.setattr(drivers, "check_clocks", lambda *clocks: None)  # the stand-in clock is this test's own
    mgr = _hooked(clock)(**trace.config)
    prep = Prepared.from_trace(trace)
    times = run_whole_steps(prep, mgr) if regime == "step" else run_interpreted(prep, mgr, regime)
    n = trace.num_steps
    assert mgr.seen == list(zip(range(n), _appended_by(trace), strict=True))  # once a step, after its appends
    assert clock.now > n * JUMP
    assert times.ns.max() < JUMP and times.step_ns.max() < JUMP  # none of the hook's time was timed
    times.check(trace.step_cows, prep.slot_digests)


@pytest.mark.parametrize("regime", ["per-call", "batched", "step"])
def test_the_untimed_runners_call_the_hook_after_each_step(trace, regime) -> None:
    mgr = _hooked(_Clock())(**trace.config)
    prep = Prepared.from_trace(trace)
    run = whole_step_runner(prep, mgr) if regime == "step" else step_runner(prep, mgr, regime)
    run(0, 5)
    run(5, trace.num_steps)
    assert mgr.seen == list(zip(range(trace.num_steps), _appended_by(trace), strict=True))


def test_a_manager_without_the_hook_replays_as_before(trace) -> None:
    mgr = REGISTRY["list"](**trace.config)
    assert not hasattr(mgr, "untimed_after_step")
    prep = Prepared.from_trace(trace)
    run_interpreted(prep, mgr, "batched").check(trace.step_cows, prep.slot_digests)
