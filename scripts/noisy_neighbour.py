"""A noisy neighbour: processes that alternate busy and idle phases of a few seconds, so the load drifts.

Usage: python scripts/noisy_neighbour.py [--procs 2] [--busy 1,5] [--idle 1,5] [--duration 600] [--seed 1]

Each of ``--procs`` processes repeats: busy for a time drawn uniformly from ``--busy`` (seconds), then idle
(asleep) for one drawn from ``--idle``. Busy work alternates NumPy matrix products on an 8 MiB working set
(the caches and memory bandwidth) and a pure-Python loop (a core), as a CI runner's other jobs would. Every
phase's length comes from a generator seeded by ``--seed`` and the process's index, so a seed gives the same
schedule each time; the machine's response to it is what varies. All processes end after ``--duration``
seconds (at most a day), or at SIGTERM or Ctrl-C. Standard library and NumPy only. ``scripts/compare_pairs.py``
runs it beside its pairs (``--neighbour``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import signal
import sys
import time

import numpy as np

MAX_DURATION_S = 86_400.0
MAX_PROCS = 64
WORKING_SET = 1024  # a 1024 x 1024 float64 matrix: 8 MiB


def schedule(seed: int, index: int, busy: tuple[float, float], idle: tuple[float, float]):
    """The endless (busy, idle) phase lengths of process ``index``, the same for the same seed."""
    rng = random.Random(seed * 1_000_003 + index)
    while True:
        yield rng.uniform(*busy), rng.uniform(*idle)


def busy_for(seconds: float, matrix: np.ndarray) -> None:
    """Work for ``seconds``: matrix products and a pure-Python loop, in turns."""
    end = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < end:
        if turn % 2:
            matrix[:] = np.tanh(matrix @ matrix[:, :64] @ matrix[:64, :]) * 0.5
        else:
            total = 0
            for i in range(200_000):
                total += i * i % 7
        turn += 1


def neighbour(index: int, args: argparse.Namespace, deadline: float) -> None:
    """One process's phases until ``deadline`` (monotonic seconds)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    matrix = np.random.default_rng(args.seed + index).random((WORKING_SET, WORKING_SET))
    for busy, idle in schedule(args.seed, index, args.busy, args.idle):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        busy_for(min(busy, left), matrix)
        time.sleep(max(0.0, min(idle, deadline - time.monotonic())))


def span(text: str) -> tuple[float, float]:
    """``LOW,HIGH`` seconds, 0 < LOW <= HIGH <= 60."""
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give LOW,HIGH in seconds, e.g. 1,5") from None
    if not 0 < low <= high <= 60:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 < LOW <= HIGH <= 60 seconds")
    return low, high


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2, help=f"processes (1 to {MAX_PROCS}; default 2)")
    parser.add_argument("--busy", type=span, default=(1.0, 5.0), help="busy phases, LOW,HIGH seconds (default 1,5)")
    parser.add_argument("--idle", type=span, default=(1.0, 5.0), help="idle phases, LOW,HIGH seconds (default 1,5)")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds until every process ends")
    parser.add_argument("--seed", type=int, default=1, help="the phases' seed (default 1)")
    args = parser.parse_args(argv)
    if not 1 <= args.procs <= MAX_PROCS:
        parser.error(f"--procs {args.procs}: give 1 to {MAX_PROCS}")
    if not 0 < args.duration <= MAX_DURATION_S:
        parser.error(f"--duration {args.duration:g}: give more than 0 and at most {MAX_DURATION_S:g} seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    deadline = time.monotonic() + args.duration
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=neighbour, args=(i, args, deadline), daemon=True) for i in range(args.procs)]
    for proc in procs:
        proc.start()

    def stop(*_: object) -> None:
        for proc in procs:
            proc.terminate()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for proc in procs:
        proc.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
