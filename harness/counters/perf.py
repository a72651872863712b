"""Linux perf hardware counters: whether this machine has them (VMs and CI machines usually do not)."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache

L1D_EVENTS = ("L1-dcache-loads", "L1-dcache-load-misses")


@cache
def perf_status() -> tuple[str, str]:
    """("supported" | "unsupported" | "unavailable", reason) for the L1D events, read from ``perf stat``."""
    if shutil.which("perf") is None:
        return "unavailable", "perf is not installed (Debian: linux-perf)"
    try:
        proc = subprocess.run(
            ["perf", "stat", "-x,", "-e", ",".join(L1D_EVENTS), "--", "true"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return "unavailable", f"perf failed to run: {exc}"
    lines = [line for line in proc.stderr.splitlines() if line and not line.startswith("#")]
    if proc.returncode != 0 and not lines:
        return "unavailable", f"perf stat failed (exit {proc.returncode}); check kernel.perf_event_paranoid"
    fields = [line.split(",") for line in lines]
    counted = [f for f in fields if len(f) > 2 and f[2] in L1D_EVENTS]
    if len(counted) < len(L1D_EVENTS):
        return "unavailable", "perf stat did not report the L1D events: " + " | ".join(lines)[:200]
    if any(f[0].startswith("<not supported>") or f[0].startswith("<not counted>") for f in counted):
        return "unsupported", "perf reports <not supported> for L1D events (no PMU exposed, e.g. a VM)"
    return "supported", "perf stat counts L1D loads and misses"
