"""Plug-ins that fake their figures (issue 36, item 2), loaded with ``--impl tests.faking_plugins:Name``.

Each is the ``dict`` design, correct on every trace check, with one way of reading faster or smaller than it is.
The clock patches act when the class's module is imported, as a plug-in's would, in the worker that imports it.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from impls.designs.dict_design import DictBlockManager

SLOWDOWN = 1000  # the patched clocks run this many times slower than the real one
_real = time.perf_counter_ns
_real_thread = time.thread_time_ns


def _slow_clock() -> int:
    return _real() // SLOWDOWN


class PatchesPerfCounter(DictBlockManager):
    """Replaces ``time.perf_counter_ns`` with a clock 1000 times slower on first construction."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        time.perf_counter_ns = _slow_clock


class PatchesHarnessClock(DictBlockManager):
    """Replaces the clock the harness bound (every module's ``perf_ns``) with one 1000 times slower."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("harness.") and hasattr(module, "perf_ns"):
                module.perf_ns = _slow_clock


class PatchesThreadClock(DictBlockManager):
    """Replaces ``time.thread_time_ns`` (the paced loops' CPU clock) with one 1000 times slower."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        real = _real_thread
        time.thread_time_ns = lambda: real() // 1000


class WorksInHook(DictBlockManager):
    """Does work of its steps in the untimed per-step hook (as a design doing the next step's work before it is
    timed would): a copy of its own tables, rebuilt after every step."""

    def untimed_after_step(self, step: int) -> None:
        self._shadow = {seq: dict(table) for seq, table in self._tables.items()}


class FakeMemory(DictBlockManager):
    """Says it holds one byte: a one-byte ``state`` and ``memory_bytes()`` of 1."""

    state = (np.zeros(1, dtype=np.uint8),)

    def memory_bytes(self) -> int:
        return 1


def _scaled_clock(keep: float):
    """A clock that lets ``keep`` of the real time pass (0.7: hides 30 %)."""
    start = _real()
    return lambda: start + int((_real() - start) * keep)


def _rebinding(keep: float) -> type:
    class HidesTime(DictBlockManager):
        """Rebinds the drivers' and the slices' clocks, in its constructor, to one that hides ``1 - keep`` of the
        time (as issue 57's review did, hiding 65 %)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            fake = _scaled_clock(keep)
            for name in ("harness.base.drivers", "harness.base.interleave"):
                if name in sys.modules:
                    sys.modules[name].perf_ns = fake

    HidesTime.__name__ = HidesTime.__qualname__ = f"Hides{round((1 - keep) * 100)}Percent"
    return HidesTime


Hides30Percent, Hides65Percent, Hides99Percent = (_rebinding(k) for k in (0.70, 0.35, 0.01))
