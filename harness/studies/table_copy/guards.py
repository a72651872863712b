"""Race guards for asynchronous copies from pinned buffers (an event: anything with ``record()``, ``synchronize()``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Event(Protocol):
    """The part of ``torch.cuda.Event`` the guards use."""

    def record(self) -> None: ...
    def synchronize(self) -> None: ...


class DoneEvent:
    """The event of a synchronous copy (CPU): complete as soon as recorded."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CopyGuard:
    """Protects a host buffer that asynchronous copies read in place (the manager's table in (a) and (c))."""

    def __init__(self, new_event: Callable[[], Event]) -> None:
        self._new_event = new_event
        self._pending: Event | None = None
        self.waits = 0

    def copied(self) -> None:
        """Mark the point after the copies that read the buffer."""
        event = self._new_event()
        event.record()
        self._pending = event

    def before_write(self) -> None:
        """Block until every copy marked by :meth:`copied` has read the buffer."""
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None
            self.waits += 1


class BufferRing:
    """``size`` staging buffers used in turn; :meth:`acquire` waits for the copy that last read the next one."""

    def __init__(self, size: int, new_event: Callable[[], Event]) -> None:
        if size < 1:
            raise ValueError(f"a ring needs at least one buffer, got {size}")
        self._new_event = new_event
        self._events: list[Event | None] = [None] * size
        self._next, self._current = 0, -1
        self.waits = 0

    def acquire(self) -> int:
        """Index of a buffer the host may overwrite now."""
        i = self._next
        event = self._events[i]
        if event is not None:
            event.synchronize()
            self._events[i] = None
            self.waits += 1
        self._current, self._next = i, (i + 1) % len(self._events)
        return i

    def copied(self) -> None:
        """Mark the point after the copies that read the buffer last acquired."""
        if self._current < 0:
            raise RuntimeError("copied() before acquire()")
        event = self._new_event()
        event.record()
        self._events[self._current] = event
