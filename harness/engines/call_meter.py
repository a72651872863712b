"""The engine's own calls apart from the shared work around them: a meter on one object's public methods.
Design: docs/output.md#harnessenginescall_meterpy."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FunctionType

import numpy as np

from harness.base.interleave import frozen_gc
from harness.base.stats import Estimate
from harness.base.steptimes import StepTimes

METERED_REPLAYS = 3  # per worker at most: after the timed repetitions, never among them
NAN = math.nan
WHOLE_STEP = "(the whole native step)"  # a design replayed in C++: its timed step holds no Python, only its calls


class CallMeter:
    """Calls and nanoseconds of the methods it wraps; a call made inside another counts within it."""

    def __init__(self) -> None:
        self.calls = 0
        self.ns = 0
        self.depth = 0

    def wrap(self, method: Callable) -> Callable:
        clock = time.perf_counter_ns

        def timed(*args, **kwargs):
            if self.depth:
                return method(*args, **kwargs)
            self.depth = 1
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                self.ns += clock() - start
                self.calls += 1
                self.depth = 0

        return timed


def public_methods(obj: object) -> list[str]:
    """The public methods of ``obj``'s class (functions, class and static methods) not shadowed on the instance."""
    own = vars(obj) if hasattr(obj, "__dict__") else {}
    return [name for name in dir(type(obj)) if not name.startswith("_") and name not in own and isinstance(
        inspect.getattr_static(type(obj), name), FunctionType | classmethod | staticmethod)]


@contextmanager
def metered(obj: object, meter: CallMeter) -> Iterator[CallMeter]:
    """``obj``'s public methods timed by ``meter`` on the instance, as they were again on leaving."""
    names = public_methods(obj)
    if not names:
        raise ValueError(f"{type(obj).__name__} has no public method to meter")
    done = []
    try:
        for name in names:
            setattr(obj, name, meter.wrap(getattr(obj, name)))
            done.append(name)
        yield meter
    finally:
        for name in done:
            delattr(obj, name)


class _Idle:
    def nothing(self, *args: object) -> None:
        return None


def meter_cost(n: int = 20_000, trials: int = 5) -> tuple[float, float]:
    """(ns the meter reads of a call of a do-nothing method, ns a metered call costs its caller beyond a plain
    one), each the least of ``trials``."""
    clock, idle, reads, added = time.perf_counter_ns, _Idle(), [], []
    for _ in range(trials):
        plain = idle.nothing
        t0 = clock()
        for _ in range(n):
            plain(n)
        t1 = clock()
        meter = CallMeter()
        with metered(idle, meter):
            wrapped = idle.nothing
            t2 = clock()
            for _ in range(n):
                wrapped(n)
            t3 = clock()
        reads.append(meter.ns / n)
        added.append(max(0.0, ((t3 - t2) - (t1 - t0)) / n))
    return min(reads), min(added)


@dataclass
class MeteredReplays:
    """One replay metered on the object in ``attribute``: per full replay, the engine's calls; and over the steps its
    thread ran whole, their ns, the timed step's whole ns (the meter's own cost taken out of both) and the
    sequence-steps (``work``); ``why``: why it was not metered."""

    attribute: str
    seq_steps: int
    read_ns: float = NAN
    added_ns: float = NAN
    calls: list[int] = field(default_factory=list)
    engine_ns: list[float] = field(default_factory=list)
    whole_ns: list[float] = field(default_factory=list)
    why: str = ""
    work: list[float] = field(default_factory=list)  # per metered replay (none given: all its seq-steps)

    def add(self, meter: CallMeter, step_ns: float, kept: tuple[int, float, float] | None = None) -> None:
        """One metered replay: its calls (``meter``) and timed ns; ``kept``: (calls, ns, seq-steps) of the steps its
        thread ran whole, which ``step_ns`` then covers (None: every step)."""
        calls, ns, work = kept if kept is not None else (meter.calls, meter.ns, self.seq_steps)
        self.calls.append(meter.calls)
        self.engine_ns.append(ns - calls * self.read_ns)
        self.whole_ns.append(step_ns - calls * self.added_ns)
        self.work.append(work)

    def _work(self) -> list[float]:
        return self.work if len(self.work) == len(self.engine_ns) else [self.seq_steps] * len(self.engine_ns)

    def merged(self, other: MeteredReplays) -> MeteredReplays:
        return MeteredReplays(self.attribute, self.seq_steps, max(self.read_ns, other.read_ns),
                              max(self.added_ns, other.added_ns), self.calls + other.calls,
                              self.engine_ns + other.engine_ns, self.whole_ns + other.whole_ns, self.why or other.why,
                              self._work() + other._work())

    def _per_seq_step(self, ns: np.ndarray) -> Estimate:
        work = np.array(self._work(), dtype=float)
        return _spread(np.array([]) if self.why else ns[work > 0] / work[work > 0])

    def per_replay(self) -> np.ndarray:
        """The engine's calls, ns per sequence-step, of each metered replay in order (NaN: no step ran whole)."""
        work = np.array(self._work(), dtype=float)
        return np.where(work > 0, np.array(self.engine_ns, dtype=float) / np.maximum(work, 1.0), NAN)

    def engine(self) -> Estimate:
        """The engine's calls, ns per sequence-step: median, and min-max over the metered replays."""
        return self._per_seq_step(np.array(self.engine_ns, dtype=float))

    def shared(self) -> Estimate:
        """The rest of the timed step (the harness side both replays share), ns per sequence-step."""
        return self._per_seq_step(np.array(self.whole_ns, dtype=float) - np.array(self.engine_ns, dtype=float))

    def calls_per_seq_step(self) -> float:
        return float(np.median(self.calls)) / max(1, self.seq_steps) if self.calls else NAN

    def how(self) -> str:
        if self.why:
            return f"engine calls not metered: {self.why}"
        whole = sum(self._work()) / max(1, self.seq_steps * len(self.engine_ns))
        if self.attribute == WHOLE_STEP:
            return (f"the whole step timed inside C++ (no Python in the timed region: the step is the design's own "
                    f"call), {len(self.calls)} replays step by step, figures over the steps the thread ran whole: "
                    f"{whole:.0%} of the seq-steps")
        return (f"the public methods of `{self.attribute}`, {self.calls_per_seq_step():.2f} calls per seq-step, "
                f"{len(self.calls)} metered replays (read {self.read_ns:.0f} ns per call of a do-nothing method, "
                f"{self.added_ns:.0f} ns added per call to the step, both subtracted; replayed step by step, "
                f"figures over the steps the thread ran whole: {whole:.0%} of the seq-steps)")


def _spread(x: np.ndarray) -> Estimate:
    if not len(x):
        return Estimate(NAN, NAN, NAN)
    return Estimate(float(np.median(x)), float(x.min()), float(x.max()))


def ratio_of_spreads(ours: Estimate, real: Estimate) -> Estimate:
    """ours / real, its range the extremes' ratios (min over max, max over min): for replays not metered in pairs."""
    if not (real.value > 0 and real.low > 0):
        return Estimate(NAN, NAN, NAN)
    return Estimate(ours.value / real.value, ours.low / real.high, ours.high / real.low)


def paired_calls_ratio(ours: MeteredReplays, real: MeteredReplays) -> Estimate:
    """ours/real on the engine's calls, replay by replay: the i-th metered replay of each side ran in the same worker,
    one after the other (``replays.Context.meter_calls``), so their ratio leaves out what drifts between workers.
    The median of those ratios and their min-max; the extremes' ratios when the replays do not pair."""
    a, b = ours.per_replay(), real.per_replay()
    if ours.why or real.why or len(a) != len(b):
        return ratio_of_spreads(ours.engine(), real.engine())
    with np.errstate(divide="ignore", invalid="ignore"):
        r = a / b
    return _spread(r[np.isfinite(r) & (r > 0)])


def merge_metered(parts: list[dict]) -> dict:
    """Each key's metered replays from every worker's part, in one."""
    out: dict = {}
    for part in parts:
        for key, m in part.items():
            out[key] = out[key].merged(m) if key in out else m
    return out


def meterable(obj: object) -> str:
    """Why the meter cannot go on ``obj`` ("" when it can)."""
    if obj is None:
        return "no such object"
    if not hasattr(obj, "__dict__"):
        return f"{type(obj).__name__} keeps no instance attributes"
    return "" if public_methods(obj) else f"{type(obj).__name__} has no public method"


def metered_replay(out: MeteredReplays, target: object, step: Callable[[int], StepTimes], work: np.ndarray) -> None:
    """One full replay, step by step (``step(s)`` replays and times step ``s``; ``work[s]`` its sequence-steps), with
    the meter on ``target``; added to ``out``. A step its thread was preempted in leaves the figures (its calls,
    their ns and its timed ns), as it leaves the timed ones (``harness.base.oncpu``)."""
    meter = CallMeter()
    calls, ns, step_ns, seq_steps = 0, 0, 0.0, 0.0
    with frozen_gc(), metered(target, meter):
        for s in range(len(work)):
            calls_before, ns_before = meter.calls, meter.ns
            times = step(s)
            if times.preempted is not None and times.preempted.any():
                continue
            calls += meter.calls - calls_before
            ns += meter.ns - ns_before
            step_ns += float(times.step_ns.sum())
            seq_steps += float(work[s])
    out.add(meter, step_ns, (calls, ns, seq_steps))


def whole_step_replay(out: MeteredReplays, step: Callable[[int], StepTimes], work: np.ndarray) -> None:
    """One full replay of a native design, step by step: its engine calls are its whole timed steps (nothing else
    runs inside them); the steps its thread was preempted in left out, as :func:`metered_replay` leaves them."""
    steps, step_ns, seq_steps = 0, 0.0, 0.0
    with frozen_gc():
        for s in range(len(work)):
            times = step(s)
            if times.preempted is not None and times.preempted.any():
                continue
            steps += 1
            step_ns += float(times.step_ns.sum())
            seq_steps += float(work[s])
    meter = CallMeter()
    meter.calls, meter.ns = steps, int(step_ns)
    out.add(meter, step_ns, (steps, step_ns, seq_steps))


def call_columns(ours: MeteredReplays | None, real: MeteredReplays | None) -> dict[str, float]:
    """The calibration row's figures of both sides' engine calls and shared work, and the ratio on the calls."""
    empty = Estimate(NAN, NAN, NAN)
    figures = {"ours_calls": ours.engine() if ours else empty, "ours_shared": ours.shared() if ours else empty,
               "real_calls": real.engine() if real else empty, "real_shared": real.shared() if real else empty}
    figures["ratio_calls"] = paired_calls_ratio(ours, real) if ours and real else empty
    out = {}
    for name, est in figures.items():
        out.update({name if name.startswith("ratio") else f"{name}_ns": est.value, f"{name}_low": est.low,
                    f"{name}_high": est.high})
    return out


def calls_how(ours: MeteredReplays | None, real: MeteredReplays | None) -> str:
    if ours is None or real is None:
        return "engine calls not metered (no engine object named for this replay)"
    return (f"engine calls apart: ours {ours.how()}; real {real.how()}; shared = the metered replay's whole timed "
            "step - its engine calls; each a median with its min-max over the metered replays, after the timed "
            "repetitions (fresh manager each); ratio_calls = ours/real engine calls, the median of the ratios of the "
            "replays metered in pairs (the same worker, one after the other) and their min-max")
