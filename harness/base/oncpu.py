"""Whether a timed interval ran on its CPU throughout: thread CPU time beside wall time. Design:
docs/measurement.md#oncpu."""

from __future__ import annotations

import resource
import time

import numpy as np

thread_ns = time.thread_time_ns
_usage = resource.getrusage
SLACK_NS = 10_000  # off-CPU time an interval may hold and count as run whole (interrupts), plus FRACTION of it
FRACTION = 0.02


def voluntary_switches() -> int:
    """How often this thread gave up its CPU by itself (its own time off the CPU: never a preemption)."""
    return _usage(resource.RUSAGE_THREAD).ru_nvcsw


def ran_share(wall_ns: float, cpu_ns: float) -> float:
    """The share of ``wall_ns`` the thread was on its CPU (1 when the CPU clock read more, as its own reads cost)."""
    return 1.0 if wall_ns <= 0 else min(1.0, cpu_ns / wall_ns)


def preempted(span_ns: np.ndarray, ran: np.ndarray) -> np.ndarray:
    """Per interval of ``span_ns`` wall nanoseconds run ``ran`` of it on the CPU: whether it was preempted."""
    span, ran = np.asarray(span_ns, dtype=float), np.asarray(ran, dtype=float)
    return (1.0 - ran) * span > SLACK_NS + FRACTION * span


def ran_whole(values: np.ndarray, span_ns: np.ndarray, ran: np.ndarray) -> np.ndarray:
    """``values`` (``[reps, steps]``), each preempted sample NaN; a step no repetition ran whole keeps its on-CPU
    share."""
    values = np.asarray(values, dtype=float)
    bad = preempted(span_ns, ran)
    out = np.where(bad, np.nan, values)
    lost = bad.all(axis=0)
    if lost.any():
        out[:, lost] = values[:, lost] * np.minimum(1.0, np.asarray(ran, dtype=float)[:, lost])
    return out
