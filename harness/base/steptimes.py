"""What every timed replay returns, whichever driver ran it: :class:`StepTimes`, nanoseconds per step and kind."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.base.oncpu import preempted
from harness.base.replay import ReplayError

KINDS = ("alloc", "free", "other", "decode", "lookup")


@dataclass
class StepTimes:
    """Raw samples of one replay: nanoseconds per step and kind, CoWs per step, and the clock used."""

    ns: np.ndarray
    cows: np.ndarray
    step_ns: np.ndarray
    timed_regions_per_step: float
    clock: str
    digests: np.ndarray | None = None
    # Per step: the wall ns its on-CPU reading covers (the step's or its slice's) and the share the thread ran.
    span_ns: np.ndarray | None = None
    ran: np.ndarray | None = None
    wall_ns: float = 0.0  # wall and thread CPU time around the replay's timed slices
    cpu_ns: float = 0.0

    @property
    def preempted(self) -> np.ndarray | None:
        """Per step, whether its thread was taken off its CPU during it (None where not read)."""
        return None if self.ran is None or self.span_ns is None else preempted(self.span_ns, self.ran)

    def check(self, step_cows: np.ndarray, slot_digests: np.ndarray, lo: int = 0) -> None:
        """Copy-on-write counts and slot digests of steps ``[lo, lo + len)`` must be the expected ones."""
        hi = lo + len(self.cows)
        bad = np.flatnonzero(self.cows != step_cows[lo:hi])
        if bad.size:
            s = lo + int(bad[0])
            raise ReplayError(f"step {s}: {self.cows[s - lo]} copy-on-writes, the trace expects {step_cows[s]}")
        if self.digests is not None:
            bad = np.flatnonzero(self.digests != slot_digests[lo:hi])
            if bad.size:
                raise ReplayError(f"step {lo + int(bad[0])}: the slot mapping differs from the trace's "
                                  "(a slot not written, or a wrong offset)")


def concat(parts: list[StepTimes]) -> StepTimes:
    """Slices of one replay, in order, as one replay."""
    digests = None if any(p.digests is None for p in parts) else np.concatenate([p.digests for p in parts])
    steps = np.array([len(p.cows) for p in parts], dtype=float)
    regions = float((steps * [p.timed_regions_per_step for p in parts]).sum() / max(1.0, steps.sum()))
    read = all(p.ran is not None and p.span_ns is not None for p in parts)
    return StepTimes(np.concatenate([p.ns for p in parts]), np.concatenate([p.cows for p in parts]),
                     np.concatenate([p.step_ns for p in parts]), regions, parts[0].clock, digests,
                     np.concatenate([p.span_ns for p in parts]) if read else None,
                     np.concatenate([p.ran for p in parts]) if read else None,
                     sum(p.wall_ns for p in parts), sum(p.cpu_ns for p in parts))
