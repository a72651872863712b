"""Paced CPU shares: every paced loop repeated, interleaved, and the floor. Design: docs/measurement.md#paced_study."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from harness.base.builds import build_of, with_build
from harness.base.drivers import Prepared
from harness.base.failures import blamed_on
from harness.base.rows import Row
from harness.base.stats import median_estimate
from harness.errors import DesignFailure
from harness.studies.paced import Paced, floor_runner, kernel_paced, paced_loop, paced_runner, whole_step_paced
from impls.registry import RATIO_BASE

PACED_REPS = 9
FLOOR = ("-", "-")
Starter = Callable[[], tuple[Callable[[int, int], None] | None, Callable[[int], None]]]


@dataclass(frozen=True)
class PacedCells:
    """One scenario's paced study, as asked: its trace prepared, each cell's manager maker and class, the step rate,
    whether the trace holds prefix-caching ops, ``reps`` repetitions of ``steps`` steps (None: every step)."""

    scenario: str
    prep: Prepared
    makers: dict[tuple[str, str], Callable]
    classes: dict[tuple[str, str], type]
    rate: float
    caching: bool
    reps: int = PACED_REPS
    steps: int | None = None


def _nothing(what: object) -> None:
    """No one listens."""


@dataclass(frozen=True)
class PacedHooks:
    """What a paced study tells as it runs: ``enter(cell)`` before a cell's code (None: its own), ``mark(key)``
    around each measured loop (the supervisor's bound), ``on_repetition(rep)`` after each repetition."""

    enter: Callable[[tuple[str, str] | None], None] = _nothing
    mark: Callable[[tuple | None], None] = _nothing
    on_repetition: Callable[[int], None] = _nothing


def _unchecked(steps: int) -> None:
    """Loops whose checks run inside them (hits per step) or that have nothing to check."""


@dataclass
class PacedKind:
    """One kind of paced loop: ``start()`` builds a fresh one, ``(run(lo, hi), check(steps))``."""

    impl: str
    regime: str
    what: str
    start: Starter
    cpu_ns: list[int] = field(default_factory=list)
    wall_ns: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    callee_ns: list[int] = field(default_factory=list)
    error: BaseException | None = None
    cls: type | None = None

    def key(self) -> tuple[str, str, str]:
        return self.impl, self.regime, f"paced:{self.what}"

    def guarded(self, fn: Callable[[], object]) -> object:
        """``fn()``; an implementation's failure becomes the kind's error (None), anything else propagates."""
        if self.cls is None:
            return fn()
        try:
            with blamed_on(self.impl, self.cls):
                return fn()
        except DesignFailure as exc:
            self.error = exc
            return None


def kinds_of(prep: Prepared, makers: dict[tuple[str, str], Callable], whole_step: set[tuple[str, str]],
             classes: dict[tuple[str, str], type] | None = None,
             direct: set[tuple[str, str]] = frozenset()) -> list[PacedKind]:
    """The study's loops: idle, each cell's decode calls, the whole step of the cells in ``whole_step``, the step
    kernel called straight for those in ``direct`` as well, the floor."""
    classes = classes or {}
    kinds = [PacedKind("-", "-", "idle", lambda: (None, _unchecked))]
    for (impl, regime), make in makers.items():
        cls, own = classes.get((impl, regime)), prep.private()
        kinds.append(PacedKind(impl, regime, "calls", partial(paced_runner, own, make, regime), cls=cls))
        if (impl, regime) in whole_step:
            kinds.append(PacedKind(impl, regime, "step", lambda make=make, own=own: whole_step_paced(own, make),
                                   cls=cls))
        if (impl, regime) in whole_step and (impl, regime) in direct:
            kinds.append(PacedKind(impl, regime, "kernel", lambda make=make, own=own: kernel_paced(own, make),
                                   cls=cls))
    kinds.append(PacedKind(*FLOOR, "floor", lambda: (floor_runner(prep), _unchecked)))
    return kinds


def run_interleaved(kinds: list[PacedKind], rate: float, steps: int, reps: int, hooks: PacedHooks = PacedHooks()
                    ) -> None:
    """``reps`` repetitions of every kind, rotated by one each repetition so that no kind always runs first or after the
    same one; each kind's first steps are run once before, outside every measurement (compilation). Each measured
    loop is marked ``(impl, regime, "paced:<what>")`` for the supervisor's bound (:mod:`harness.run.bound`)."""
    for kind in kinds:
        hooks.enter((kind.impl, kind.regime) if kind.cls is not None else None)
        kind.guarded(lambda kind=kind: _first_steps(kind, steps))
    for rep in range(reps):
        live = [k for k in kinds if k.error is None]
        for kind in live[rep % len(live):] + live[:rep % len(live)] if live else []:
            hooks.enter((kind.impl, kind.regime) if kind.cls is not None else None)
            measured = kind.guarded(lambda kind=kind: _measured_loop(kind, rate, steps, hooks.mark))
            if measured is None:
                continue
            kind.cpu_ns.append(measured.cpu_ns)
            kind.wall_ns.append(measured.wall_ns)
            kind.misses.append(measured.misses)
            kind.callee_ns.append(measured.callee_ns)
        hooks.on_repetition(rep)


def _first_steps(kind: PacedKind, steps: int) -> None:
    run, _ = kind.start()
    if run is not None:
        run(0, min(2, steps))


def _measured_loop(kind: PacedKind, rate: float, steps: int, mark: Callable[[tuple | None], None]) -> Paced:
    run, check = kind.start()
    mark(kind.key())
    measured = paced_loop(run, rate, steps)
    mark(None)
    check(steps)
    return measured


def paced_claims(kinds: list[PacedKind]) -> dict[tuple, tuple[int, int]]:
    """Per marked loop key, the thread CPU and wall ns its repetitions claimed, summed."""
    return {kind.key(): (sum(kind.cpu_ns), sum(kind.wall_ns)) for kind in kinds if kind.cpu_ns}


def shares(kind: PacedKind, idle: PacedKind) -> np.ndarray:
    """The kind's CPU share per repetition: thread CPU time minus the idle loop's, over wall time."""
    n = min(len(kind.cpu_ns), len(idle.cpu_ns))
    cpu, wall, base = (np.asarray(x[:n], dtype=float) for x in (kind.cpu_ns, kind.wall_ns, idle.cpu_ns))
    return (cpu - base) / wall * 100


def above(kind: PacedKind, floor: PacedKind) -> np.ndarray:
    """Per repetition, the kind's share of thread CPU inside its calls minus the floor's (sleeps left out)."""
    n = min(len(kind.callee_ns), len(floor.callee_ns))
    own, base = (np.asarray(k.callee_ns[:n], dtype=float) / np.asarray(k.wall_ns[:n], dtype=float)
                 for k in (kind, floor))
    return (own - base) * 100


METRICS = {"calls": ("cpu_share_observed_pct", "deadline_misses"),
           "step": ("cpu_share_observed_whole_step_pct", "deadline_misses_whole_step"),
           "floor": ("paced_floor_pct", None)}
PAIRED = ("paced_above_floor_pct", "paced_step_over_kernel_pct")
PACED_METRICS = frozenset({m for pair in METRICS.values() for m in pair if m} | set(PAIRED))
CALLS_HOW = {"per-call": "the contract's calls per step from Python (one per operation and sequence); compiled "
                         "designs pay one dispatch per call",
             "batched": "one decode_step call per step from Python, pool operations per call; compiled designs pay "
                        "one dispatch per call",
             "step": "one step() call per step (the step regime's path), as an engine would call it"}
HOW = {"step": "one step() call per step (pool operations and decode batch), as an engine would call it",
       "floor": "a compiled function that does nothing, called once per step with the step kernel's arguments: "
                "the floor of any block manager entered once per step"}


def study_rows(scenario: str, kinds: list[PacedKind], rate: float, steps: int) -> list[Row]:
    """The study's rows from the kinds' repetitions."""
    idle = next(k for k in kinds if k.what == "idle")
    floor = next(k for k in kinds if k.what == "floor")
    kernels = {(k.impl, k.regime): k for k in kinds if k.what == "kernel"}
    rows: list[Row] = []
    for kind in kinds:
        if kind.what in ("idle", "kernel"):
            continue
        share_metric, miss_metric = METRICS[kind.what]
        common = {"step_rate": rate, "steps": steps, "driver": "python"}
        path = CALLS_HOW[kind.regime] if kind.what == "calls" else HOW[kind.what]
        how = (f"open loop paced at {rate:g} steps/s from Python ({steps} steps), {path}; thread CPU time "
               f"minus the same repetition's idle paced loop, median of interleaved repetitions, 95 % bootstrap "
               f"interval")
        how = with_build(how, build_of(kind.cls))
        if kind.error is not None or not kind.cpu_ns or idle.error is not None:
            why = kind.error or idle.error or "no repetition finished"
            rows.append(Row(scenario, kind.impl, kind.regime, share_metric, float("nan"), "%", "thread_time_ns",
                            "failed", why.reason if isinstance(why, DesignFailure) else str(why)))
            continue
        per_rep = shares(kind, idle)
        est = median_estimate(per_rep)
        rows.append(Row(scenario, kind.impl, kind.regime, share_metric, est.value, "%", "thread_time_ns", "ok", how,
                        reps=len(per_rep), ci_low=_finite(est.low), ci_high=_finite(est.high), **common))
        if miss_metric:
            misses = median_estimate(np.asarray(kind.misses, dtype=float))
            rows.append(Row(scenario, kind.impl, kind.regime, miss_metric, misses.value, "steps", "perf_counter_ns",
                            "ok", f"steps whose work ended after the next step was due, of {steps}; median of "
                            "interleaved repetitions", reps=len(kind.misses), ci_low=_finite(misses.low),
                            ci_high=_finite(misses.high), steps=steps, driver="python"))
        if kind.what == "step" and floor.error is None and floor.callee_ns:
            rows.append(_above_row(scenario, kind, floor, common))
        if kind.what == "step" and (kind.impl, kind.regime) in kernels:
            rows.append(_over_kernel_row(scenario, kind, kernels[(kind.impl, kind.regime)], common))
    return rows


def _above_row(scenario: str, kind: PacedKind, floor: PacedKind, common: dict) -> Row:
    """``paced_above_floor_pct``: the whole step's calls over the do-nothing crossing's, paired per repetition."""
    est = median_estimate(above(kind, floor))
    return Row(scenario, kind.impl, kind.regime, "paced_above_floor_pct", est.value, "%", "thread_time_ns", "ok",
               "the whole step's share of thread CPU inside its step() calls minus the do-nothing crossing's inside "
               "its calls (thread CPU clock read around each call, in both loops alike), paired repetition by "
               "repetition (the same run, the same machine state); median, 95 % bootstrap interval",
               reps=min(len(kind.callee_ns), len(floor.callee_ns)), ci_low=_finite(est.low),
               ci_high=_finite(est.high), **common)


def _over_kernel_row(scenario: str, step: PacedKind, kernel: PacedKind, common: dict) -> Row:
    """``paced_step_over_kernel_pct``: the whole step's calls over its kernel's called straight, paired."""
    metric = PAIRED[1]
    if kernel.error is not None or not kernel.callee_ns:
        why = kernel.error.reason if isinstance(kernel.error, DesignFailure) else "no repetition finished"
        return Row(scenario, step.impl, step.regime, metric, float("nan"), "%", "thread_time_ns", "failed",
                   f"the step kernel called straight: {why}")
    est = median_estimate(above(step, kernel))
    return Row(scenario, step.impl, step.regime, metric, est.value, "%", "thread_time_ns", "ok",
               "the whole step's share of thread CPU inside its step() calls minus that of the same design's step "
               "kernel called straight with the same arguments, in a paced loop of its own (step()'s checks and "
               "dispatch: what an engine calling the kernel itself would not pay), paired repetition by repetition; "
               "median, 95 % bootstrap interval", reps=min(len(step.callee_ns), len(kernel.callee_ns)),
               ci_low=_finite(est.low), ci_high=_finite(est.high), **common)


def _finite(x: float) -> float | None:
    return None if x != x else x


def paced_study_rows(study: PacedCells, hooks: PacedHooks = PacedHooks(), claims: dict | None = None) -> list[Row]:
    """Every paced figure of a scenario; ``claims`` (when given) receives :func:`paced_claims`."""
    prep, classes = study.prep, study.classes
    steps = min(study.steps or prep.num_steps, prep.num_steps)
    stepped = {c for c in study.makers if c[1] == "batched" and callable(getattr(classes.get(c), "step", None))}
    unsupported = sorted(stepped) if study.caching else []
    rows = [Row(study.scenario, impl, regime, METRICS["step"][0], float("nan"), "%", "thread_time_ns", "unsupported",
                "step() does not take the prefix-caching ops yet") for impl, regime in unsupported]
    direct = {c for c in stepped if c[0] == RATIO_BASE and getattr(classes.get(c), "kernels", None) is not None}
    kinds = kinds_of(prep, study.makers, set() if study.caching else stepped, classes, direct)
    run_interleaved(kinds, study.rate, steps, study.reps, hooks)
    if claims is not None:
        claims.update(paced_claims(kinds))
    return rows + study_rows(study.scenario, kinds, study.rate, steps)
