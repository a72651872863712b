"""One host thread for every block manager: torch's intra-op thread pool is pinned to one thread for a run.

A block manager runs on the scheduler's host thread, and the benchmark states single-thread costs. Torch's
default pool (one thread per core) made the ``sglang`` contender's small tensor operations wait on a helper
thread, several times the CPU time of one thread, and its figures then followed the machine's load rather than
the code (README, "Timing rules", quotes the measurement).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


def pin_one_thread() -> int | None:
    """In a worker process (ours alone): torch, if an implementation imported it, uses one intra-op thread from
    now on; returns that count, or None when torch is not loaded. Called again after every import of an
    implementation: a worker imports torch only when it loads a design that needs it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    torch.set_num_threads(1)
    return torch.get_num_threads()


@contextmanager
def one_intra_op_thread() -> Iterator[int | None]:
    """Within the block: torch (if an implementation imported it) uses one intra-op thread. Yields that count,
    or None when torch is not loaded; the previous count is restored on exit."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield None
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(before)
