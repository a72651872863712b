"""Where the paced whole step's CPU goes: batched ``flat``'s ``step()`` against its kernel's entry point called
directly (no Python-side buffer checks), each hot (steps back to back) and paced (one step every 1/rate s,
sleeping in between, as ``harness/measure/paced.py`` does).

Usage: python scripts/paced_floor.py [--scenario paper] [--reps 3] [--steps N] [--out FILE]

A paced step costs more CPU than the same step back to back: between steps the thread sleeps, and the step
then runs in caches (and, on a VM, a vCPU) that other work has used. The entry-point rows show what the
whole-step figure would be with free argument checks; the gap between hot and paced is that wake-up cost.
Prints one line per repetition and kind; ``--out`` also writes them (atomically).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.measure.drivers import Prepared, whole_step_runner
from harness.measure.paced import _paced_loop
from harness.output.results import atomic_write_text
from impls import REGISTRY
from scenarios import generate


def runner(prep: Prepared, kind: str):
    """``(manager, run(lo, hi))`` over a fresh ``flat``: through ``step()`` or straight to the kernel's entry
    point."""
    mgr = REGISTRY["flat"](**prep.trace.config)
    if kind == "step":  # as the bench's paced whole-step run calls it
        return mgr, whole_step_runner(prep, mgr, check=False)
    op, a0, a1 = prep.arrays64
    args = [(op[f:m], a0[f:m], a1[f:m], prep.decode_ids[s]) for s, (f, m, _) in enumerate(prep.bounds)]
    status = np.zeros(max(m - f for f, m, _ in prep.bounds) + 2, dtype=np.int64)
    cow = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot = np.zeros(prep.max_batch, dtype=np.int64)
    # The trace's own arrays, which step() accepts on its fast path: exactly the kernel's types.
    entry, limits = mgr._ep_step, (mgr.max_seqs, mgr.max_tokens, mgr.num_blocks)

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            entry(*args[s], status, cow, slot, *limits)
    return mgr, run


def measure(prep: Prepared, kind: str, rate: float, steps: int) -> tuple[float, float]:
    """(hot us per step, paced us per step of CPU above an idle paced loop)."""
    _, run = runner(prep, kind)
    t0 = time.perf_counter_ns()
    run(0, steps)
    hot = (time.perf_counter_ns() - t0) / steps / 1e3
    idle, _, _ = _paced_loop(None, rate, steps)
    cpu, _, _ = _paced_loop(runner(prep, kind)[1], rate, steps)
    return hot, (cpu - idle) / steps / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="paper")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default: the whole trace)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    trace = generate(args.scenario)
    prep = Prepared.from_trace(trace)
    rate = float(trace.header["params"].get("step_rate", 2000))
    steps = min(args.steps or prep.num_steps, prep.num_steps)
    runner(prep, "step")[1](0, min(2, steps))  # compile or load the kernels outside every measurement
    period_us = 1e6 / rate
    lines = [f"# {args.scenario}: batched flat, {steps} steps at {rate:g} steps/s; us of CPU per step "
             f"(share of the {period_us:g} us period)"]
    for rep in range(args.reps):
        for kind in ("step", "entry"):
            hot, paced = measure(prep, kind, rate, steps)
            lines.append(f"rep {rep} {kind:5s} hot {hot:6.1f} us ({hot / period_us * 100:5.2f} %)  "
                         f"paced {paced:6.1f} us ({paced / period_us * 100:5.2f} %)")
            print(lines[-1], flush=True)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
