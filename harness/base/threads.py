"""One host thread for every block manager: torch's intra-op thread pool is pinned to one thread for a run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


def pin_one_thread() -> int | None:
    """In a worker process (ours alone): torch, if an implementation imported it, uses one intra-op thread from now on;
    returns that count, or None when torch is not loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    torch.set_num_threads(1)
    return torch.get_num_threads()


@contextmanager
def one_intra_op_thread() -> Iterator[int | None]:
    """Within the block: torch (if an implementation imported it) uses one intra-op thread."""
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
