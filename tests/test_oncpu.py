"""A step its thread was preempted in is left out of every figure, on both sides of a pairing; a design's own waiting
is not (harness/base/oncpu.py, docs/measurement.md#oncpu)."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest

from harness.base import interleave as il
from harness.base.drivers import KINDS, Prepared, StepTimes
from harness.base.metrics import Work, step_ns_lists, timing_rows
from harness.base.oncpu import FRACTION, SLACK_NS, preempted, ran_whole
from harness.base.stats import paired_reps
from impls.designs.dict_design import DictBlockManager
from scenarios import generate

WORK = Work.uniform(steps=4, seqs_per_step=10)


def sample(step_ns: list[float], off_ns: list[float] | None = None) -> StepTimes:
    """Whole steps of ``step_ns`` read from Python, each with ``off_ns`` of its interval off the CPU."""
    n = len(step_ns)
    ns = np.zeros((n, len(KINDS)))
    ns[:, KINDS.index("decode")] = step_ns
    span = np.array(step_ns, dtype=float)
    off = np.zeros(n) if off_ns is None else np.array(off_ns, dtype=float)
    return StepTimes(ns, np.zeros(n, dtype=np.int64), span.copy(), 1.0, "perf_counter_ns", None, span,
                     1.0 - off / span, float(span.sum()), float(span.sum() - off.sum()))


def seq_step(samples: list[StepTimes]) -> float:
    rows = timing_rows(("s", "i", "batched"), WORK, samples, samples, 2000, 0.0, "test")
    return next(r.value for r in rows if r.metric == "seq_step_ns")


def test_off_cpu_beyond_an_interrupt_is_a_preemption() -> None:
    span = np.array([1e6, 1e6, 1e5, 1e8])
    off = np.array([SLACK_NS + FRACTION * 1e6 + 1, SLACK_NS, SLACK_NS + FRACTION * 1e5 + 1, 0.01 * 1e8])
    assert preempted(span, 1 - off / span).tolist() == [True, False, True, False]


def test_a_preempted_sample_leaves_the_figure_and_a_step_none_ran_whole_keeps_its_on_cpu_share() -> None:
    values = np.array([[1e5, 3e5], [9e5, 3e5]])
    span = values.copy()
    ran = np.array([[1.0, 1 / 3], [1 / 9, 1 / 3]])  # step 0 of rep 1 preempted; step 1 preempted in both
    out = ran_whole(values, span, ran)
    assert np.isnan(out[1, 0]) and out[0, 0] == 1e5
    assert out[:, 1] == pytest.approx([1e5, 1e5])


def test_the_figure_is_what_the_steps_cost_on_the_cpu() -> None:
    """Rep 2's step 1 was preempted for 5 ms: the figure is the clean repetitions' (old code: the median moved)."""
    clean = [sample([1e6] * 4), sample([1e6] * 4)]
    hit = sample([1e6, 6e6, 6e6, 1e6], [0, 5e6, 5e6, 0])
    assert seq_step([*clean, hit]) == pytest.approx(seq_step(clean * 2)) == pytest.approx(1e5)
    assert seq_step([hit, hit, hit]) == pytest.approx(1e5)  # steps no repetition ran whole: their on-CPU share


def test_pairs_leave_out_a_step_either_side_did_not_run_whole() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(900, 1100, size=(8, 50))
    new = base * 1.1
    hit = new.copy()
    hit[:, 7] = np.nan  # NEW preempted at step 7 in every pair: that step leaves BASE's totals too
    hit[3, :20] = np.nan
    assert paired_reps(hit, base).value == pytest.approx(1.1, rel=1e-9)


def test_raw_files_keep_a_preempted_sample_as_none() -> None:
    lists = step_ns_lists([sample([1e4, 2e5], [0, 0]), sample([1e4, 9e5], [0, 7e5])])
    assert lists == [[10_000, 200_000], [10_000, None]]


def blocked_design(seconds: float):
    class Waits(DictBlockManager):
        """A dict design that waits on every decode step: off its CPU by its own doing."""

        def decode_step(self, seq_ids, cow_out, slot_out):
            time.sleep(seconds)
            return super().decode_step(seq_ids, cow_out, slot_out)

    return Waits


def replay(cls: type, steps: int = 40, reps: int = 1) -> list[StepTimes]:
    trace = generate("paper", steps=steps, running=8)
    prep = Prepared.from_trace(trace)
    driver = il.Driver(prep, cls, "batched", {}, "x")
    key = ("x", "batched", "")
    return il.interleaved({key: driver}, il.Turns(reps, il.slice_bounds(steps, 4)), False).samples[key]


def test_a_design_that_waits_keeps_its_wait() -> None:
    """Handing work elsewhere and waiting is the design's own time: never left out as a preemption."""
    times = replay(blocked_design(0.002))
    for s in times:
        assert not s.preempted.any()
        assert s.step_ns.min() >= 2e6
    assert s.wall_ns > 0 and s.cpu_ns < s.wall_ns / 2


REPLAY_LOW = """
import os, sys
os.sched_setaffinity(0, {{{CPU}}})
os.nice(5)  # below the rival: the scheduler must take the CPU away, whatever else the machine runs
sys.path.insert(0, {ROOT!r})
from tests.test_oncpu import SpinsInDecode, replay
times = replay(SpinsInDecode, steps=30, reps=1)
print(sum(int(s.preempted.sum()) for s in times), sum(s.cpu_ns for s in times) < sum(s.wall_ns for s in times))
"""


class SpinsInDecode(DictBlockManager):
    """A dict design whose decode step computes for 5 ms: longer than a scheduler tick, so a preemption lands in
    it (reading the thread's CPU clock between steps makes the kernel take an expired time slice there)."""

    def decode_step(self, seq_ids, cow_out, slot_out):
        _spin(0.005)
        return super().decode_step(seq_ids, cow_out, slot_out)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.slow  # two processes pinned to one CPU, one at a lower priority: tens of seconds on a loaded machine
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux's CPU affinity")
def test_a_process_competing_for_the_cpu_is_seen() -> None:
    """A busy process on the replay's CPU, at a higher priority than the replay's, takes it away for whole time
    slices: the steps it took the CPU in are marked preempted."""
    import subprocess
    import sys
    from pathlib import Path

    cpu = min(os.sched_getaffinity(0))
    rival = multiprocessing.get_context("spawn").Process(target=_spin, args=(60.0,), daemon=True)
    rival.start()
    try:
        os.sched_setaffinity(rival.pid, {cpu})
        root = str(Path(__file__).resolve().parents[1])
        done = subprocess.run([sys.executable, "-c", REPLAY_LOW.format(CPU=cpu, ROOT=root)], capture_output=True,
                              text=True, timeout=300, check=False, cwd=root)
    finally:
        rival.kill()
        rival.join()
    assert done.returncode == 0, done.stderr[-2000:]
    marked, less_cpu = done.stdout.split()
    assert int(marked) > 0 and less_cpu == "True", done.stdout
