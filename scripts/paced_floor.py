"""Where the paced whole step's CPU goes: batched ``flat``'s ``step()``, its kernel called straight (no
Python-side checks), and a compiled function that does nothing, called with the same arguments (the floor of
one crossing into compiled code per step); each hot (steps back to back) and paced (one step every 1/rate s,
sleeping in between, as ``harness/studies/paced.py`` does).

Usage: python scripts/paced_floor.py [--scenario paper] [--reps 3] [--steps N] [--out FILE]

A paced step costs more CPU than the same step back to back: between steps the thread sleeps, and the step
then runs in caches (and, on a VM, a vCPU) that other work has used. The ``noop`` rows show what a paced step
costs when it does no work at all: no block manager called once per step can be observed below it. Kinds are
interleaved within each repetition; the last lines give each kind's median and range over the repetitions.
Prints one line per repetition and kind; ``--out`` also writes them (atomically).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.base.drivers import Prepared, whole_step_runner
from harness.base.files import atomic_write_text
from harness.studies.paced import noop_step, paced_loop, step_arguments
from impls import REGISTRY
from scenarios import generate

KINDS = ("step", "kernel", "noop")


def runner(prep: Prepared, kind: str):
    """``(manager, run(lo, hi))`` over a fresh ``flat``: through ``step()``, straight to its kernel's exact
    dispatcher (what ``step()`` calls for these buffers, without the Python around it), or to the do-nothing
    :func:`harness.studies.paced.noop_step` (the paced study's floor row)."""
    mgr = REGISTRY["flat"](**prep.trace.config)
    if kind == "step":  # as the bench's paced whole-step run calls it
        return mgr, whole_step_runner(prep, mgr, check=False)
    args, buffers, limits = step_arguments(prep)  # the trace's own arrays, plain int64: the kernel's types
    call = mgr._ep_step_exact if kind == "kernel" else noop_step

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            call(*args[s], *buffers, *limits)
    return mgr, run


def measure(prep: Prepared, kind: str, rate: float, steps: int) -> tuple[float, float]:
    """(hot us per step, paced us per step of CPU above an idle paced loop)."""
    _, run = runner(prep, kind)
    t0 = time.perf_counter_ns()
    run(0, steps)
    hot = (time.perf_counter_ns() - t0) / steps / 1e3
    idle = paced_loop(None, rate, steps).cpu_ns
    cpu = paced_loop(runner(prep, kind)[1], rate, steps).cpu_ns
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
    for kind in KINDS:  # compile or load the kernels outside every measurement
        runner(prep, kind)[1](0, min(2, steps))
    period_us = 1e6 / rate
    lines = [f"# {args.scenario}: batched flat, {steps} steps at {rate:g} steps/s; us of CPU per step "
             f"(share of the {period_us:g} us period)"]
    paced: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for rep in range(args.reps):
        for kind in KINDS:
            hot, paced_us = measure(prep, kind, rate, steps)
            paced[kind].append(paced_us)
            lines.append(f"rep {rep} {kind:6s} hot {hot:6.1f} us ({hot / period_us * 100:5.2f} %)  "
                         f"paced {paced_us:6.1f} us ({paced_us / period_us * 100:5.2f} %)")
            print(lines[-1], flush=True)
    for kind, values in paced.items():
        mid, lo, hi = (v / period_us * 100 for v in (statistics.median(values), min(values), max(values)))
        lines.append(f"paced {kind:6s} median {mid:5.2f} % of the period, range {lo:5.2f}-{hi:5.2f} % "
                     f"({len(values)} repetitions)")
        print(lines[-1], flush=True)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
