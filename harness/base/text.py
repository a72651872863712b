"""Text for people, shared by the run's progress line and the reports: durations."""

from __future__ import annotations

import math


def duration_text(seconds: float) -> str:
    """``10 min 37 s`` (``42 s`` under a minute, ``1 h 02 min`` from an hour); "unknown" for NaN."""
    if math.isnan(seconds):
        return "unknown"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
