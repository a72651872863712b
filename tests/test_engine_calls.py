"""The engine's own calls apart from the shared work (issue 38, item 6): the call meter, its figures, and a
calibration worker metering both sides of the nano-vllm stand-in after its timed repetitions."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from harness.base.stats import Estimate
from harness.calibration.table import CalibrationRow
from harness.engines import call_meter as engine_calls
from harness.engines.call_meter import (
    CallMeter,
    MeteredReplays,
    call_columns,
    merge_metered,
    meter_cost,
    meterable,
    metered,
    public_methods,
    ratio_of_spreads,
)


class Engine:
    """A stand-in engine object: public methods that call each other, a property, a private helper."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def outer(self, n: int) -> int:
        self.log.append("outer")
        return self.inner(n) + self._private(n)

    def inner(self, n: int) -> int:
        self.log.append("inner")
        return n * 2

    def fails(self) -> None:
        raise KeyError("the engine's own error")

    @classmethod
    def made(cls) -> str:
        return cls.__name__

    @property
    def size(self) -> int:
        return len(self.log)

    def _private(self, n: int) -> int:
        return n


class Slotted:
    __slots__ = ("x",)

    def call(self) -> int:
        return 1


def test_the_meter_wraps_the_public_methods_only() -> None:
    assert public_methods(Engine()) == ["fails", "inner", "made", "outer"]
    assert meterable(Engine()) == "" and "no instance attributes" in meterable(Slotted())
    assert meterable(None) == "no such object"


def test_a_nested_public_call_counts_once_and_the_object_is_restored() -> None:
    engine, meter = Engine(), CallMeter()
    with metered(engine, meter):
        assert engine.outer(3) == 9 and engine.inner(1) == 2 and engine.made() == "Engine" and engine.size == 3
    assert meter.calls == 3  # outer (its inner within it), inner, made; the property is not a call
    assert meter.ns >= 0 and meter.depth == 0
    assert engine.log == ["outer", "inner", "inner"]
    assert not set(vars(engine)) - {"log"}  # nothing left on the instance
    assert engine.outer.__func__ is Engine.outer and engine.made.__func__ is Engine.made.__func__


def test_an_exception_propagates_and_leaves_the_object_as_it_was() -> None:
    engine, meter = Engine(), CallMeter()
    with pytest.raises(KeyError, match="the engine's own error"), metered(engine, meter):
        engine.inner(1)
        engine.fails()
    assert meter.calls == 2 and meter.depth == 0
    assert vars(engine) == {"log": ["inner"]}
    with pytest.raises(AttributeError), metered(Slotted(), CallMeter()):
        pass


def test_the_meter_s_own_cost_is_measured_on_a_method_that_does_nothing() -> None:
    read, added = meter_cost(n=200, trials=2)
    assert read >= 0 and added >= 0 and math.isfinite(read + added)


def test_the_figures_take_the_meter_s_cost_out_of_both_sides() -> None:
    meter = CallMeter()
    meter.calls, meter.ns = 4, 1000
    m = MeteredReplays("allocator", seq_steps=10, read_ns=10.0, added_ns=5.0)
    m.add(meter, step_ns=3000.0)
    meter.ns = 1400
    m.add(meter, step_ns=3400.0)
    assert m.engine_ns == [960.0, 1360.0] and m.whole_ns == [2980.0, 3380.0]
    assert m.engine() == Estimate(116.0, 96.0, 136.0)  # per seq-step: median, min, max
    assert m.shared() == Estimate(202.0, 202.0, 202.0)
    assert m.calls_per_seq_step() == 0.4 and "`allocator`, 0.40 calls per seq-step, 2 metered replays" in m.how()
    both = merge_metered([{("k",): m}, {("k",): MeteredReplays("allocator", 10, 12.0, 5.0, [4], [500.0], [900.0])}])
    assert both[("k",)].engine_ns == [960.0, 1360.0, 500.0] and both[("k",)].read_ns == 12.0
    m.why = "it failed"
    assert math.isnan(m.engine().value) and m.how() == "engine calls not metered: it failed"


def test_a_metered_replay_leaves_out_the_steps_its_thread_was_preempted_in() -> None:
    """Replayed step by step: a preempted step's calls, their time and its timed step leave the figures, as they
    leave the timed figures; the call count stays the whole replay's (deterministic)."""
    import numpy as np

    from harness.base.steptimes import StepTimes

    engine = Engine()

    def step(s: int) -> StepTimes:
        engine.inner(s)
        ran = 0.5 if s == 1 else 1.0  # step 1 ran half its wall time: preempted
        return StepTimes(np.zeros((1, 5)), np.zeros(1), np.array([1e6]), 1.0, "perf_counter_ns", None,
                         np.array([1e6]), np.array([ran]))

    m = MeteredReplays("engine", seq_steps=30, read_ns=0.0, added_ns=0.0)
    engine_calls.metered_replay(m, engine, step, np.array([10, 10, 10]))
    assert m.calls == [3] and m.work == [20.0] and m.whole_ns == [2e6]  # steps 0 and 2
    assert m.engine().value == m.engine_ns[0] / 20 and "67% of the seq-steps" in m.how()


def test_the_ratio_on_the_engine_s_calls_pairs_the_replays_metered_together() -> None:
    """The i-th metered replay of each side ran in the same worker, one after the other: a drift between workers
    that moves both sides alike leaves their ratio alone (the extremes' ratios would read 0.8 to 1.25 here)."""
    from harness.engines.call_meter import paired_calls_ratio

    ours = MeteredReplays("a", 10, 0.0, 0.0, [1, 1, 1], [1000.0, 1100.0, 1250.0], [2000.0] * 3)
    real = MeteredReplays("b", 10, 0.0, 0.0, [1, 1, 1], [1000.0, 1100.0, 1250.0], [2000.0] * 3)
    assert paired_calls_ratio(ours, real) == Estimate(1.0, 1.0, 1.0)
    assert call_columns(ours, real)["ratio_calls_low"] == 1.0
    unpaired = MeteredReplays("b", 10, 0.0, 0.0, [1, 1], [1000.0, 1250.0], [2000.0] * 2)
    r = paired_calls_ratio(ours, unpaired)  # no pairs: the extremes' ratios
    assert (r.low, r.high) == (1000.0 / 1250.0, 1250.0 / 1000.0)


def test_the_ratio_on_the_engine_s_calls_and_its_columns() -> None:
    r = ratio_of_spreads(Estimate(150.0, 140.0, 160.0), Estimate(100.0, 80.0, 125.0))
    assert (r.value, r.low, r.high) == (1.5, 140.0 / 125.0, 2.0)
    assert math.isnan(ratio_of_spreads(Estimate(1.0, 1.0, 1.0), Estimate(0.0, 0.0, 0.0)).value)
    ours = MeteredReplays("a", 10, 0.0, 0.0, [1], [1500.0], [2500.0])
    real = MeteredReplays("b", 10, 0.0, 0.0, [1], [1000.0], [2000.0])
    columns = call_columns(ours, real)
    assert set(columns) <= {f.name for f in fields(CalibrationRow)} and len(columns) == 15
    assert columns["ratio_calls"] == 1.5 and columns["ours_shared_ns"] == 100.0 and columns["real_calls_ns"] == 100.0
    assert math.isnan(call_columns(None, real)["ratio_calls"])


@pytest.fixture(scope="module")
def standin_measured(tmp_path_factory):
    """One calibration worker's replays of the nano-vllm stand-in and the contender on a short ``paper`` trace."""
    from harness.calibration.replays import CalibrationJob, Context
    from harness.engines import nano_vllm_engine
    from harness.engines.catalog import ENGINES
    from harness.engines.loader import engine_imports
    from harness.run.workers import Events
    from scenarios import generate
    from tests.calibration_standin import write_standin

    root = write_standin(tmp_path_factory.mktemp("nano") / "nano-src")
    job = CalibrationJob("nano-vllm", str(root), "standin", "paper", {}, reps=2, only=[0, 1])
    with engine_imports(nano_vllm_engine.plan(), root):
        baselines = nano_vllm_engine.baselines(nano_vllm_engine.load(), "standin")
        trace = generate("paper", steps=24, running=12, num_blocks=2048)
        measured = Context(ENGINES["nano-vllm"], trace, job, Events(lambda message: None)).measure(baselines, "plan")
    return measured, [b.name for b in baselines]


@pytest.mark.slow  # an end-to-end run, ~10 s (make test-slow, .ci/run)
def test_a_worker_meters_both_sides_after_its_timed_repetitions(standin_measured) -> None:
    """The nano-vllm stand-in and the contender, in a calibration worker's context: every replay with an engine
    object is metered, in each regime (the same calls in every metered replay: the count is deterministic, and the
    contender's the engine's), the timed samples kept."""
    measured, baselines = standin_measured
    assert not measured.failed
    regimes = ("per-call", "batched")  # the engine's code replayed in each regime the contender is calibrated in
    keys = {("nano-vllm", r, "") for r in regimes} | {(b, r, "real") for b in baselines for r in regimes}
    assert set(measured.metered) == keys and set(measured.samples) == keys
    for r in regimes:  # like for like: the model makes the engine's calls, in either regime
        ours, real = measured.metered[("nano-vllm", r, "")], measured.metered[("hashing neutralised", r, "real")]
        assert ours.calls == real.calls
    for key, m in measured.metered.items():
        assert not m.why, m.why
        assert len(m.calls) == 2 and m.calls[0] == m.calls[1] >= m.seq_steps, key  # a call per sequence per step
        assert m.attribute == ("bm" if key[2] else "block_manager")
        slack = max(0.0, m.added_ns - m.read_ns)  # each side's meter cost taken out: the calls lie within the step
        assert all(0 <= e <= w + c * slack for e, w, c in zip(m.engine_ns, m.whole_ns, m.calls, strict=True)), key
        assert all(0 < work <= m.seq_steps for work in m.work)  # the steps run whole, replayed step by step
        assert all(math.isfinite(x) for e in (m.engine(), m.shared()) for x in (e.value, e.low, e.high))
    assert engine_calls.METERED_REPLAYS >= 2


@pytest.mark.slow  # shares the ~10 s worker run above (make test-slow, .ci/run)
def test_each_row_pairs_ours_with_the_engine_replayed_in_the_same_regime(standin_measured) -> None:
    """A per-call row's engine figure, interval and engine calls come from the engine's per-call replay, a batched
    row's from its batched replay (before, both from the batched one)."""
    from types import SimpleNamespace

    from harness.base.stats import ratio_of_sums
    from harness.calibration import run
    from harness.engines.catalog import ENGINES

    measured, baselines = standin_measured
    opts = run.Options(ENGINES["nano-vllm"], "standin", ["paper"], {})
    context = run.Context(opts, SimpleNamespace(version="standin", digest="tree-sha256:x"), "paper")
    context.parts = [measured]
    assert context.merge() == {}
    rows = [row for b in measured.baselines for row in context.rows_of(b)]
    assert {(r.baseline, r.call_shape) for r in rows} == {(b, r) for b in baselines for r in ("per-call", "batched")}
    for row in rows:
        real_key = (row.baseline, row.call_shape, "real")
        real = ratio_of_sums(*context.blocks(real_key))
        assert row.real_call_shape == row.call_shape and row.real_ns_per_seq_step == real.value
        assert row.real_calls_ns == context.metered[real_key].engine().value
        assert f"the engine's code through the {row.call_shape} regime" in row.how
    by = {(r.baseline, r.call_shape): r for r in rows}
    per_call, batched = by[("hashing neutralised", "per-call")], by[("hashing neutralised", "batched")]
    assert per_call.real_ns_per_seq_step != batched.real_ns_per_seq_step  # two replays, not one
