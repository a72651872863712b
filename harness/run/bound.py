"""The supervisor's bound: a cell's timed regions against its worker's CPU time, read from the main process.

Per marked slice the main process reads the worker's CPU clock (:class:`Meter`); a cell whose timed regions
claim under :data:`FRACTION` of its slices' CPU time beyond the harness's own work (a do-nothing design's CPU
time outside its timed regions, :mod:`harness.run.floor`) fails. It catches clocks slowed or stopped
several-fold; work in a constructor or handed to another process is not bounded.
"""

from __future__ import annotations

import time

Cell = tuple[str, str]
FRACTION = 0.8  # of the CPU time beyond the floor that a cell's timed regions must claim (on CPU), from Python
COMPILED_FRACTION = 0.1  # compiled and C++ replays (docs/measurement.md#bound-and-floor)
SLACK_NS = 250_000  # per slice: the harness's work that differs between cells (first calls, caches, Numba
# typing a design's state at each compiled replay call: slow for typed containers, and slower in a cold worker;
# beside other work, the harness's own code refilling caches after each preemption)
FLOOR_FACTOR = 1.5  # the floor's slices run alone; a cell's run among others, their caches colder


def process_cpu_ns(pid: int) -> int | None:
    """CPU time of process ``pid`` (all threads) in nanoseconds, from its kernel clock; None where unreadable."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # Linux: the process's CPU clock (CPUCLOCK_SCHED)
    except (AttributeError, OSError):
        return None


class Meter:
    """CPU time and slices per key, from the main process's readings at each of a worker's marks."""

    def __init__(self) -> None:
        self.readings: dict[tuple, tuple[int, int]] = {}
        self.reset()
        self._at = 0

    def mark(self, pid: int, key: tuple | None) -> None:
        """The worker starts ``key``'s slice (None: work of no key); what it spent since the last mark goes to
        the last mark's key."""
        now = process_cpu_ns(pid)
        if now is None:
            self.usable = False
            return
        wall = time.monotonic_ns()
        if self._key is not None:
            cpu, slices = self.readings.get(self._key, (0, 0))
            self.readings[self._key] = (cpu + now - self._at, slices + 1)
            self.walls[self._key] = self.walls.get(self._key, 0) + wall - self._wall_at
        self._key, self._at, self._wall_at = (tuple(key) if key is not None else None), now, wall

    def attach(self, result: object) -> object:
        """``result`` with the readings since the job started in its ``supervised`` field (when it has one),
        set here, whatever the worker put there; the meter starts afresh."""
        if hasattr(result, "supervised"):
            result.supervised = dict(self.readings) if self.usable else None
        if hasattr(result, "supervised_wall"):
            result.supervised_wall = dict(self.walls) if self.usable else None
        self.reset()
        return result

    def reset(self) -> None:
        """Forget every reading (a job starts)."""
        self.readings, self._key, self.usable = {}, None, True
        self.walls: dict[tuple, int] = {}  # wall time per key, read here (the paced loops' bound)
        self._wall_at = 0


def claimed_ns(result) -> dict[tuple, float]:
    """Per key, the CPU ns its timed regions claim (each step's time x the share its thread ran), all samples."""
    out: dict[tuple, float] = {}
    for samples in (result.steps, result.details):
        for key, pairs in samples.items():
            out[key] = out.get(key, 0.0) + sum(on_cpu_ns(times) for _, times in pairs)
    return out


def on_cpu_ns(times) -> float:
    steps = times.ns.sum(axis=1)
    return float((steps * times.ran).sum()) if getattr(times, "ran", None) is not None else float(steps.sum())


def floor_per_slice(readings: dict | None, claimed: dict[str, float]) -> dict[str, float]:
    """The harness's own CPU ns per slice, by regime or driver: the floor's readings less what it claimed."""
    return {key[1]: max(0.0, cpu - claimed.get(key[1], 0.0)) / slices
            for key, (cpu, slices) in (readings or {}).items() if len(key) == 2 and key[0] == "floor" and slices}


def violations(result, floor: dict[str, float]) -> dict[Cell, str]:
    """The cells of a timing result (:class:`harness.run.cells.TimingResult`) whose timed regions claim
    less than the bound allows given ``floor`` (:func:`floor_per_slice`), each with a one-line reason; none when
    the worker's CPU time was unreadable."""
    readings = result.supervised
    if readings is None:
        return {}
    out: dict[Cell, str] = {}
    for key, claimed in claimed_ns(result).items():
        cell = tuple(key[:2])
        if cell not in result.failed and cell not in out:
            info = result.info.get(cell)
            reason = judge(claimed, readings.get(tuple(key), (0, 0)), floor, "python" if info is None else
                           info.driver, key[1])
            if reason:
                out[cell] = reason
    return out


def judge(claimed: float, reading: tuple[int, int], floor: dict[str, float], driver: str, regime: str) -> str:
    """Why one key's claimed nanoseconds break the bound, given its (CPU ns, slices) and the floors per slice
    (by regime for the Python driver, else by driver); "" when they do not, or no floor was measured for a
    compiled or C++ driver (its design could not be loaded)."""
    cpu, slices = reading
    kind = regime if driver == "python" else driver
    if slices == 0:
        return "its worker reported samples of replays it never marked to the supervisor"
    if kind not in floor:
        return "" if driver != "python" else "its worker measured no floor of the harness's own work"
    spent = cpu - FLOOR_FACTOR * slices * floor[kind]
    fraction = FRACTION if driver == "python" else COMPILED_FRACTION
    if claimed >= fraction * spent - SLACK_NS * slices:
        return ""
    return (f"its timed regions claim {claimed / 1e6:.2f} ms, under {fraction:.0%} of the {spent / 1e6:.2f} ms of "
            "CPU time its worker spent in them beyond the harness's own work (a clock the design changed, or work "
            "done outside the timed calls)")


def paced_violations(claims: dict[tuple, tuple[int, int]], cpu: dict | None, wall: dict | None) -> dict[Cell, str]:
    """Cells whose paced loops claim under :data:`FRACTION` of the CPU time the supervisor read, or more wall time
    than passed; none when its clocks were unreadable."""
    if cpu is None or wall is None:
        return {}
    out: dict[Cell, str] = {}
    for key, (cpu_claim, wall_claim) in claims.items():
        cpu_read, loops = cpu.get(key, (0, 0))
        if not loops:
            out[key[:2]] = "its worker reported paced loops it never marked to the supervisor"
        elif cpu_claim < FRACTION * cpu_read - SLACK_NS * loops:
            out[key[:2]] = (f"its paced loops claim {cpu_claim / 1e6:.2f} ms of CPU time, under {FRACTION:.0%} of the "
                            f"{cpu_read / 1e6:.2f} ms its worker spent in them (a clock the design changed)")
        elif wall_claim > wall.get(key, 0) + SLACK_NS * loops:
            out[key[:2]] = (f"its paced loops claim {wall_claim / 1e6:.1f} ms of wall time, more than the "
                            f"{wall.get(key, 0) / 1e6:.1f} ms that passed (a clock the design changed)")
    return out
