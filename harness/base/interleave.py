"""All cells' timed replays, interleaved in slices so drift hits all alike. Design: docs/measurement.md#interleave."""

from __future__ import annotations

import gc
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from harness.base import clock
from harness.base.builds import build_of
from harness.base.clock import perf_ns
from harness.base.drivers import (
    Prepared,
    StepTimes,
    compiled_step_runner,
    concat,
    driver_for,
    is_native,
    native_step_runner,
    run_compiled,
    run_interpreted,
    run_native,
    run_whole_steps,
    slot_digest,
    step_runner,
)
from harness.base.failures import blamed_on
from harness.base.oncpu import ran_share, thread_ns, voluntary_switches
from harness.base.replay import ReplayError, apply_pool_op, check_end_state
from harness.errors import DesignFailure

WARM_STEPS = 5  # untimed steps each cell replays first (compilation, caches)
SLICES_PER_REP = 20
# Compiled and C++ cells replay this many times the repetitions: more managers shrink their largest spread.
FAST_REPS = 3

Key = tuple[str, str, str]


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Timed replays with the collector's existing objects frozen: no collection walks them mid-slice."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def slice_bounds(num_steps: int, slices: int = SLICES_PER_REP) -> list[tuple[int, int]]:
    """``[lo, hi)`` step ranges: ``slices`` near-equal slices of the trace (fewer for a short trace)."""
    size = max(1, math.ceil(num_steps / max(1, slices)))
    return [(lo, min(num_steps, lo + size)) for lo in range(0, num_steps, size)] or [(0, 0)]


def replay_slices(blocks: list[tuple[int, int]], rep: int, reps: int) -> list[tuple[int, int]]:
    """The step ranges repetition ``rep`` of ``reps`` replays: ``blocks`` cut ``rep/reps`` of a slice later."""
    size, num_steps = blocks[0][1] - blocks[0][0], blocks[-1][1]
    shift = (rep % max(1, reps)) * size // max(1, reps)
    if shift == 0:
        return list(blocks)
    cuts = [0, *range(shift, num_steps, size), num_steps]
    return list(itertools.pairwise(cuts))


def schedule(n: int, rep: int, num_slices: int) -> list[list[int]]:
    """Per slice of repetition ``rep``, the order in which cells ``0..n-1`` replay it."""
    strides = [s for s in range(1, n) if math.gcd(s, n) == 1] or [1]
    stride = strides[rep % len(strides)]
    perm = [j * stride % n for j in range(n)]
    return [perm[i % n:] + perm[: i % n] for i in range(num_slices)] if n else [[] for _ in range(num_slices)]


@dataclass
class Driver:
    """How one (implementation, regime) is replayed: fresh managers, timed slices, untimed advances."""

    prep: Prepared
    cls: type
    regime: str
    compiled_loops: dict
    impl: str
    inputs: Prepared = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.inputs = self.prep if self.kind == "native" else self.prep.private()

    @property
    def kind(self) -> str:
        if self.regime == "batched" and is_native(self.cls):
            return "native"
        if self.regime == "batched" and getattr(self.cls, "kernels", None) is not None and clock.tsc_usable():
            return "compiled"
        return "python"

    @property
    def separate_detail(self) -> bool:
        """Whether per-operation times need their own replays (whole-step timing is one region otherwise)."""
        return self.kind != "python"

    def loop(self):
        key = (self.impl, self.prep.caching)
        if key not in self.compiled_loops:
            self.compiled_loops[key] = driver_for(self.cls.kernels, self.prep)
        return self.compiled_loops[key]

    def new(self):
        return self.cls(**self.prep.trace.config)

    def warm_up(self, steps: int = WARM_STEPS) -> None:
        """Untimed first steps on a fresh manager through every call the timed loop makes, the batched ``lookup``
        included: first calls (compilation, cache loads) stay outside every timed region, on both sides of ``ab``."""
        mgr, hi = self.new(), min(steps, self.prep.num_steps)
        self.advance(mgr)(0, hi)
        if self.kind == "python" and self.regime == "batched" and hi:
            ids = self.inputs.decode_ids[hi - 1]  # active right after their step's decode, as in the timed loop
            mgr.lookup(ids, np.zeros(self.inputs.max_batch, dtype=np.int64))

    def timed(self, mgr, detail: bool, lo: int, hi: int) -> StepTimes:
        if self.kind == "native":
            return run_native(self.inputs, mgr, detail, lo, hi)
        if self.kind == "compiled":
            times = run_compiled(self.inputs, mgr, self.loop(), detail, lo, hi)
        elif self.regime == "step":
            times = run_whole_steps(self.inputs, mgr, lo, hi)
        else:
            times = run_interpreted(self.inputs, mgr, self.regime, lo, hi)
        self.check_inputs(lo, hi)
        return times

    def check_inputs(self, lo: int, hi: int) -> None:
        """:class:`ReplayError` when the design wrote into the arrays it was handed for steps ``[lo, hi)``."""
        changed = self.inputs.changed_inputs(self.prep, lo, hi) if self.inputs is not self.prep else ""
        if changed:
            raise ReplayError(f"{self.impl} wrote into its inputs: {changed} changed during its replay")

    def advance(self, mgr, cows: np.ndarray | None = None) -> Callable[[int, int], None]:
        """Untimed ``run(lo, hi)`` through the same call path (allocation counts, warm-up)."""
        if self.kind == "native":
            return native_step_runner(self.inputs, mgr, cows)
        if self.kind == "compiled":
            return compiled_step_runner(self.inputs, mgr, self.loop(), cows)
        return step_runner(self.inputs, mgr, self.regime, cows)

    @property
    def build(self) -> str:
        """How the implementation's code was compiled (the rows' ``build`` column)."""
        return build_of(self.cls)

    def how(self) -> str:
        if self.regime == "step":
            return "closed loop from Python, one step() call per decode step (the whole step), perf_counter_ns"
        return {"native": "closed loop, whole trace replayed inside C++ (one foreign call per slice)",
                "compiled": "closed loop, whole step compiled (Numba replay loop calling the kernels), TSC",
                "python": f"closed loop from Python, {self.regime}, perf_counter_ns"}[self.kind]

    def timer_overhead(self, calib: dict) -> float:
        if self.kind == "python":
            return calib["python_timer_ns"]
        if self.kind == "native":
            from harness.base import native

            return native.timer_overhead_ns(20_000)
        return calib["compiled_timer_ns"]


def verify_slots(driver: Driver) -> None:
    """Replay the trace through the contract from Python and check every step's slot mapping: for the native driver,
    whose C++ loop keeps its slots to itself (the timed replays check the others as they go)."""
    prep, mgr = driver.inputs, driver.new()
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    bs = prep.trace.config["block_size"]
    for s, (first, mid, end) in enumerate(prep.bounds):
        for i in range(first, mid):
            apply_pool_op(mgr, prep.op[i], prep.a0[i], prep.a1[i], prep.hash_args.get(i))
        slot_out[:] = -1
        mgr.decode_step(prep.decode_ids[s], cow_out, slot_out)
        if slot_digest(slot_out[: end - mid], bs) != prep.slot_digests[s]:
            raise ReplayError(f"step {s}: the slot mapping differs from the trace's")


@dataclass
class Replays:
    """What interleaved repetitions produced: samples per key, failures, and each key's last manager."""

    samples: dict[Key, list[StepTimes]] = field(default_factory=dict)
    reps: dict[Key, list[int]] = field(default_factory=dict)
    failed: dict[Key, DesignFailure] = field(default_factory=dict)
    last_mgr: dict[Key, object] = field(default_factory=dict)


def _nothing(what: object) -> None:
    """No one listens."""


@dataclass(frozen=True)
class Turns:
    """Which repetitions interleaved replays make: ``reps`` of every key (``caps[key]`` for a key it names), of which
    this process replays ``only`` (None: all), each over ``slices``."""

    reps: int
    slices: list[tuple[int, int]]
    caps: dict[Key, int] = field(default_factory=dict)
    only: Iterable[int] | None = None


@dataclass(frozen=True)
class Hooks:
    """What interleaved replays tell as they go: ``enter(key)`` before a key's code runs, ``mark(key)`` before each
    timed slice and ``mark(None)`` after a repetition's last (the supervisor's bound), ``pause((detail, rep,
    slice))`` before each slice (other designs' workers take their turn: ``lockstep``), ``done(key)`` after each
    of a key's ``reps`` repetitions."""

    enter: Callable[[Key], None] = _nothing
    mark: Callable[[Key | None], None] = _nothing
    pause: Callable[[tuple[int, ...]], None] = _nothing
    done: Callable[[Key], None] = _nothing


def interleaved(drivers: dict[Key, Driver], turns: Turns, detail: bool, hooks: Hooks = Hooks()) -> Replays:
    """Every repetition ``turns`` asks of every driver, interleaved slice by slice (whole steps, or with ``detail``
    per operation)."""
    out = Replays()
    total = max([turns.reps, *turns.caps.values()])
    chosen = set(range(total) if turns.only is None else turns.only)
    for rep in range(total):
        keys = [k for k in drivers if rep < turns.caps.get(k, turns.reps)]
        if not keys:
            break
        if rep not in chosen:
            continue
        bounds = replay_slices(turns.slices, rep, total)
        orders = [[keys[j] for j in order] for order in schedule(len(keys), rep, len(bounds))]
        mgrs = _new_managers(drivers, orders[0], out, hooks.enter)
        parts: dict[Key, list[StepTimes]] = {k: [] for k in mgrs}
        with frozen_gc():
            for k_slice, ((lo, hi), order) in enumerate(zip(bounds, orders, strict=True)):
                hooks.pause((int(detail), rep, k_slice))
                for k in (k for k in order if k in parts and k not in out.failed):
                    hooks.enter(k)
                    hooks.mark(k)
                    try:
                        parts[k].append(_slice(drivers[k], mgrs[k], detail, (lo, hi)))
                    except DesignFailure as exc:
                        out.failed[k] = exc
            hooks.mark(None)
        for k in (k for k in keys if k in parts):
            hooks.enter(k)
            _finish(drivers[k], mgrs[k], parts[k], out, (k, rep))
            if rep < turns.reps:
                hooks.done(k)
    return out


def _new_managers(drivers: dict[Key, Driver], keys: list[Key], out: Replays,
                  enter: Callable[[Key], None] = _nothing) -> dict:
    """A fresh manager per key, in ``keys``' order; a constructor that fails fails its key. Constructors run
    unmarked: building a large pool is work no timed region claims (docs/measurement.md#bound-and-floor)."""
    mgrs = {}
    for k in keys:
        if k in out.failed:
            continue
        enter(k)
        try:
            with blamed_on(drivers[k].impl, drivers[k].cls):
                mgrs[k] = drivers[k].new()
        except DesignFailure as exc:
            out.failed[k] = exc
    return mgrs


def _slice(driver: Driver, mgr, detail: bool, span: tuple[int, int]) -> StepTimes:
    """One timed slice ``[lo, hi)`` of ``driver`` on ``mgr``, with its wall and CPU time; :class:`DesignFailure`
    (blamed on the design) where it fails."""
    lo, hi = span
    with blamed_on(driver.impl, driver.cls):
        waits = voluntary_switches()
        c0 = thread_ns()
        w0 = perf_ns()
        times = driver.timed(mgr, detail, lo, hi)
        w1 = perf_ns()
        times = read_slice(times, w1 - w0, thread_ns() - c0, voluntary_switches() > waits)
        if rebound := clock.changed():
            raise ReplayError(f"the design rebound the harness's timing code ({rebound}): its figures cannot be "
                              "trusted")
    return times


def read_slice(times: StepTimes, wall_ns: float, cpu_ns: float, blocked: bool = False) -> StepTimes:
    """``times`` with its slice's wall and CPU time (per step too where the driver read none; run whole if it
    ``blocked``)."""
    if not isinstance(times, StepTimes):  # a stand-in driver's (tests)
        return times
    times.wall_ns, times.cpu_ns = float(wall_ns), float(cpu_ns)
    steps = len(times.step_ns)
    if blocked:
        times.ran = np.ones(steps)
        times.span_ns = np.full(steps, float(wall_ns)) if times.span_ns is None else times.span_ns
    elif times.ran is None or times.span_ns is None:
        times.span_ns = np.full(steps, float(wall_ns))
        times.ran = np.full(steps, ran_share(wall_ns, cpu_ns))
    return times


def _finish(driver: Driver, mgr, parts: list[StepTimes], out: Replays, at: tuple[Key, int]) -> None:
    """Check repetition ``rep`` of ``key`` (``at``) as a whole replay, and keep it."""
    key, rep = at
    if key in out.failed:
        return
    try:
        with blamed_on(driver.impl, driver.cls):
            samples = concat(parts)
            samples.check(driver.prep.trace.step_cows, driver.prep.slot_digests)
            check_end_state(driver.prep.trace, mgr)
    except DesignFailure as exc:
        out.failed[key] = exc
        return
    out.samples.setdefault(key, []).append(samples)
    out.reps.setdefault(key, []).append(rep)
    out.last_mgr[key] = mgr
