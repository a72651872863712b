"""L1D miss rate and instructions per sequence-step, for the measured region only. Design: docs/measurement.md#l1d."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.base.rows import Row
from harness.counters import callgrind
from harness.counters.perf import L1D_EVENTS, perf_status
from scenarios import Trace, save

# Fixed, not the CPU count: a cell's count moves slightly with the other cells in its process.
CALLGRIND_PROCESSES = 2

WARM_STEPS = 20  # past the paper trace's first step, which is not a steady-state step
STEPS, QUICK_STEPS = 16, 4
PERF_EVENTS = (*L1D_EVENTS, "instructions")


def _perf_region(trace_path: Path, impl: str, regime: str, label: str, warm: int, steps: int,
                 events: tuple[str, ...]) -> dict[str, float]:
    """Counts of ``events`` over one labelled region of the region script, under ``perf stat --control``."""
    with tempfile.TemporaryDirectory(prefix="kvb-perf-") as tmp:
        ctl, ack, out = Path(tmp) / "ctl", Path(tmp) / "ack", Path(tmp) / "perf.csv"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        cmd = ["perf", "stat", "-x,", "-o", str(out), "-e", ",".join(events), "--delay=-1",
               f"--control=fifo:{ctl},{ack}", "--", sys.executable, "-m", "harness.counters.regions",
               "--trace", str(trace_path), "--warm", str(warm), "--steps", str(steps),
               "--perf", str(ctl), str(ack), label, "--cell", impl, regime]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"perf stat failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
        counts: dict[str, float] = {}
        for line in out.read_text().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2] in events:
                if not fields[0] or fields[0].startswith("<"):
                    raise RuntimeError(f"perf could not count {fields[2]}: {fields[0]}")
                counts[fields[2]] = float(fields[0])
        return counts


def perf_counts(trace_path: Path, impl: str, regime: str, warm: int, steps: int,
                events: tuple[str, ...] = PERF_EVENTS) -> dict[str, float]:
    """Region minus empty region, per event (two perf processes)."""
    full = _perf_region(trace_path, impl, regime, f"{impl}|{regime}|{steps}", warm, steps, events)
    empty = _perf_region(trace_path, impl, regime, f"{impl}|{regime}|0", warm, steps, events)
    return {event: full[event] - empty.get(event, 0.0) for event in full}


def l1d_counter(quick: bool = False) -> str:
    """What :func:`l1d_rows` will count with here: ``perf``, else ``callgrind``, else why neither runs."""
    if perf_status()[0] == "supported":
        return "perf"
    return "no perf; callgrind is not run with --quick" if quick else "callgrind"


def l1d_rows(name: str, trace: Trace, cells: list[tuple[str, str]], quick: bool = False) -> list[Row]:
    """``l1d_miss_pct`` and ``instructions_per_seq_step`` rows for every cell of one trace."""
    steps = QUICK_STEPS if quick else STEPS
    warm = min(WARM_STEPS, max(1, trace.num_steps - steps))
    seq_steps = int(trace.running_per_step()[warm : warm + steps].sum())
    region = f"steps {warm}-{warm + steps} ({seq_steps} sequence-steps), minus the same call over zero steps"
    rows: list[Row] = []
    status, reason = perf_status()
    with tempfile.TemporaryDirectory(prefix="kvb-l1d-") as tmp:
        path = save(trace, Path(tmp) / "trace.npz")
        if status == "supported":
            for impl, regime in cells:
                try:
                    c = perf_counts(path, impl, regime, warm, steps)
                    miss_pct = c["L1-dcache-load-misses"] / c["L1-dcache-loads"] * 100
                    rows += [
                        Row(name, impl, regime, "l1d_miss_pct", miss_pct, "%", "perf",
                            how=f"perf stat L1D load misses / loads, {region}"),
                        Row(name, impl, regime, "l1d_misses_per_seq_step", c["L1-dcache-load-misses"] / seq_steps,
                            "misses", "perf", how=f"perf stat L1D load misses / sequence-steps, {region}"),
                        Row(name, impl, regime, "instructions_per_seq_step", c["instructions"] / seq_steps, "instr",
                            "perf", how=f"perf stat instructions, {region}"),
                    ]
                except (RuntimeError, KeyError, ZeroDivisionError, OSError, subprocess.SubprocessError) as exc:
                    rows.append(Row(name, impl, regime, "l1d_miss_pct", float("nan"), "%", "perf", "failed", str(exc)))
            return rows
        rows += [Row(name, impl, regime, "l1d_miss_pct", float("nan"), "%", "perf", status, reason)
                 for impl, regime in cells]
        if quick:
            return rows + [Row(name, impl, regime, "l1d_miss_pct", float("nan"), "%", "callgrind-sim", "skipped",
                               "not run with --quick (valgrind takes minutes)") for impl, regime in cells]
        ok, why = callgrind.available()
        if not ok:
            return rows + [Row(name, impl, regime, "l1d_miss_pct", float("nan"), "%", "callgrind-sim", "unavailable",
                               why) for impl, regime in cells]
        try:
            counts = callgrind.measure(path, cells, warm_steps=warm, steps=steps, cache_sim=True,
                                       split=CALLGRIND_PROCESSES)
        except callgrind.CallgrindError as exc:
            return rows + [Row(name, impl, regime, "l1d_miss_pct", float("nan"), "%", "callgrind-sim", "failed",
                               str(exc)[-300:]) for impl, regime in cells]
    for (impl, regime), c in counts.items():
        rows += [
            Row(name, impl, regime, "l1d_miss_pct", c.l1d_miss_pct, "%", "callgrind-sim",
                how=f"{callgrind.CACHE_GEOMETRY}; (D1mr + D1mw) / (Dr + Dw); {region}; Numba code for generic "
                    "x86-64 (valgrind has no AVX-512)"),
            Row(name, impl, regime, "l1d_misses_per_seq_step", (c.d1mr + c.d1mw) / c.seq_steps, "misses",
                "callgrind-sim", how=f"{callgrind.CACHE_GEOMETRY}; (D1mr + D1mw) / sequence-steps; {region}"),
            Row(name, impl, regime, "instructions_per_seq_step", c.instructions_per_seq_step, "instr", "callgrind",
                how=f"callgrind Ir / sequence-steps, {region}"),
        ]
    return rows
