"""Worker processes: where every implementation's code runs during a run, supervised.

A run's measurements run in worker processes (spawned, so each is a fresh interpreter that places its arrays
anew), one job at a time: nothing is ever timed while another job runs. A worker tells the main process which
cell it is working on before it runs that cell's code (:meth:`Events.cell`), reports progress
(:meth:`Events.tick`), and sends the job's result. The main process supervises it:

- no message for ``deadline`` seconds: the worker is killed, and the cell it was in is blamed (a hang);
- the worker dies (a signal such as SIGSEGV from a plug-in's C code, ``os._exit``, the out-of-memory killer):
  the cell it was in is blamed (a crash);
- an exception of ours in the worker comes back with its traceback (:class:`WorkerBug`), never blamed on a
  design.

:class:`CellDied` names the cell and the reason; the caller records the cell as failed and runs the job again
without it, in a fresh worker. Repetitions spread over several workers make the intervals include the
variation between processes, as pyperf spreads its values over processes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import multiprocessing
import os
import resource
import signal
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harness.base import coderoot, lifetime
from harness.base.args import DEFAULT_DEADLINE_S
from harness.errors import InputError
from harness.run.bound import Meter

OWN_CODE_DEADLINE_S = 3600.0  # outside any cell: our own code (a callgrind study is one silent call of minutes)
Cell = tuple[str, str]  # (impl, regime)
REASON_CHARS = 300
Position = tuple[int, ...]  # (pass, repetition, slice)
STOP_WAIT_S = 2.0  # a worker asked to stop may finish its job this long before it is killed


@dataclass(frozen=True)
class WorkerSpec:
    """A worker: the one implementation it runs ("": none), its share of the repetitions, its code: "" this
    checkout, else the absolute path of another checkout whose designs it imports under this checkout's harness
    (:mod:`harness.base.coderoot`, which lists the forms)."""

    impl: str = ""
    share: int = 0
    code: str = ""


@functools.cache
def _repository():
    """The repository whose modules a worker of another code root imports from that root."""
    return coderoot.repository()


class CodeUnloadable(InputError):
    """A worker of another version's code could not import it; the message says why, on one line."""


class ForeignCode(InputError):
    """A worker of another version's code imported a module from elsewhere than that version."""


class WorkerBug(RuntimeError):
    """An exception of ours inside a worker; the message carries the worker's traceback."""

    cell: Cell | None = None

    def last_line(self) -> str:
        """The traceback's last line: ``Type: message``."""
        lines = [line for line in str(self).splitlines() if line.strip()]
        return lines[-1].strip()[:REASON_CHARS] if lines else "an exception"


@dataclass
class CellDied(Exception):
    """The worker died or hung while running ``cell``'s code (None: outside any cell, which is ours)."""

    cell: Cell | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.cell[0]} {self.cell[1]}" if self.cell else "outside any cell"
        return f"a worker {self.reason} ({where})"


class Events:
    """What a job tells the main process while it runs (in the worker: over the pipe; in tests: callbacks)."""

    def __init__(self, send: Callable[[tuple], None], receive: Callable[[], object] | None = None) -> None:
        self._send, self._receive = send, receive

    def mark(self, key: tuple | None) -> None:
        """A timed slice of ``key`` starts (None: it ended); returns once the main process has read this
        worker's CPU time (:mod:`harness.run.bound`). Nothing without a main process to answer."""
        if self._receive is not None:
            self._send(("mark", key))
            self._receive()

    def cell(self, cell: Cell | None) -> None:
        """The job is about to run ``cell``'s code (None: its own code again)."""
        self._send(("cell", cell))

    def tick(self, what: str) -> None:
        """One unit of progress (the progress bar's)."""
        self._send(("tick", what))

    def status(self, what: str) -> None:
        """What is under way now (no unit of progress)."""
        self._send(("status", what))

    def pause(self, position: Position) -> None:
        """Wait at ``position`` until the main process says go (:mod:`harness.run.lockstep`)."""
        if self._receive is not None:
            self._send(("ready", position))
            if self._receive() != "go":
                raise SystemExit(0)


def _serve(conn, execute: Callable[[Any, Events], Any], audit: Callable[[], str] | None = None) -> None:
    """The worker's loop: receive a job, run it, send its result (or our exception's traceback; or what ``audit``
    finds imported from elsewhere). Forked from a shield (:func:`harness.base.lifetime.shield`); its first message
    is its process id. Ctrl-C is the main process's to handle: it stops the workers."""
    lifetime.shield()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_memory()
    importlib.import_module("harness.base.clock").seal()  # this code root's timing names, before any design loads
    conn.send(("pid", os.getpid()))
    events = Events(conn.send, conn.recv)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            result = execute(job, events)
        except MemoryError:  # after a design's allocations: the worker is spent
            conn.send(("oom", traceback.format_exc(limit=-1)))
            return
        except BaseException:
            conn.send(("bug", traceback.format_exc()))
            continue
        foreign = audit() if audit is not None else ""
        conn.send(("foreign", foreign) if foreign else ("result", result))


def _serve_in(conn, execute: str, code: str, repo: str) -> None:  # runs in the worker
    """:func:`_serve` with ``code``'s version of the repository (``coderoot.enter``), ``execute`` (``module:function``)
    imported there; a version that does not import says why and ends."""
    try:
        coderoot.enter(code, repo)
        execute_there = coderoot.resolve(execute)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the version's code may raise anything at import, or exit
        conn.send(("unloadable", coderoot.failure(exc, code)))
        with contextlib.suppress(EOFError, OSError):
            conn.recv_bytes()  # the job sent meanwhile (unread: ending before it came could break the pipe)
        return
    _serve(conn, execute_there, coderoot.audit)


def _meminfo_bytes(path: str, field: str) -> int:
    """A ``field:  N kB`` line of a /proc file, in bytes (0 where unreadable)."""
    try:
        with open(path, encoding="ascii") as info:
            return next((int(line.split()[1]) << 10 for line in info if line.startswith(field + ":")), 0)
    except (OSError, ValueError):
        return 0


def memory_available() -> int:
    """Bytes the system can give new allocations now (``MemAvailable``; 0 where unknown)."""
    return _meminfo_bytes("/proc/meminfo", "MemAvailable")


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def memory_limit() -> int:
    """A worker's address space: what it mapped at its start plus 3/4 of the memory then available (8 GiB to the
    physical memory), so a design exhausting memory meets MemoryError before the kernel's OOM killer acts."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
    mapped, available = _meminfo_bytes("/proc/self/status", "VmSize"), memory_available()
    room = mapped + available * 3 // 4 if available else physical
    return max(8 << 30, min(physical, room))


def limit_memory() -> None:
    """Hold this process to :func:`memory_limit` (where the system allows a limit)."""
    limit = memory_limit()
    if limit:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


class Worker:
    """One supervised worker process, started on first use and again after it died or was killed."""

    def __init__(self, execute: Callable[[Any, Events], Any], deadline_s: float = DEFAULT_DEADLINE_S,
                 code: str = "") -> None:
        self.execute, self.deadline_s, self.code = execute, deadline_s, coderoot.check(code)
        self._proc = self._conn = None
        self.cell: Cell | None = None
        self.last_cell: Cell | None = None
        self.meter = Meter()  # the worker's CPU time at each of its marks, read here

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        if self.code:
            ref = f"{self.execute.__module__}:{self.execute.__qualname__}"
            target, args = _serve_in, (child, ref, self.code, str(_repository()))
        else:
            target, args = _serve, (child, self.execute)
        proc = ctx.Process(target=target, args=args, daemon=True)
        try:
            proc.start()
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self._proc, self._conn, self.pid = proc, parent, proc.pid

    def run(self, job: Any, on_tick: Callable[[str], None] = lambda what: None,
            on_status: Callable[[str], None] = lambda what: None) -> Any:
        """Run ``job`` in the worker and return its result; :class:`CellDied` when the worker hung or died (it
        is then stopped, and the next job starts a fresh one), :class:`WorkerBug` for an exception of ours."""
        self.submit(job)
        while True:
            kind, value = self.advance(on_tick, on_status)
            if kind == "result":
                return value
            self.go()

    def submit(self, job: Any) -> None:
        """Send ``job``, starting the worker if needed."""
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self.cell = self.last_cell = None
        self._conn.send(job)
        self.meter.reset()

    def go(self) -> None:
        """Let a paused job go on."""
        self._conn.send("go")

    def advance(self, on_tick: Callable[[str], None] = lambda what: None,
                on_status: Callable[[str], None] = lambda what: None) -> tuple[str, Any]:
        """The job's next pause ``("ready", position)`` or its end ``("result", value)``; raises as :meth:`run`."""
        while True:
            kind, value = self._receive(self.cell)
            if kind == "cell":
                self.cell = tuple(value) if value is not None else None
                self.last_cell = self.cell or self.last_cell
            elif kind == "tick":
                on_tick(value)
            elif kind == "status":
                on_status(value)
            elif kind == "pid":
                self.pid = value
            elif kind == "mark":
                self.meter.mark(self.pid, value)
                self._conn.send(True)
            elif kind == "bug":
                raise WorkerBug(f"an exception in a worker process:\n{value}")
            elif kind in ("unloadable", "foreign"):
                self.stop()
                raise (CodeUnloadable if kind == "unloadable" else ForeignCode)(value)
            elif kind == "oom":
                self.stop()
                raise CellDied(self.last_cell, "ran out of memory (its limit: the address space it started with "
                                               "plus three quarters of the memory then available)")
            else:
                return kind, (self.meter.attach(value) if kind == "result" else value)

    def _receive(self, cell: Cell | None) -> tuple:
        """The worker's next message. The deadline is the design's: it runs while the worker is inside a cell.
        Outside any cell the worker runs our own code (starting, loading a trace, a callgrind study that is one
        call of minutes), which only :data:`OWN_CODE_DEADLINE_S` bounds: a worker silent that long is our bug."""
        started = time.monotonic()
        limit = self.deadline_s if cell is not None else max(self.deadline_s, OWN_CODE_DEADLINE_S)
        while not self._conn.poll(1.0):
            if not self._proc.is_alive():
                raise self._died(cell)
            if time.monotonic() - started > limit:
                self.stop()
                raise CellDied(cell, f"made no progress for {limit:g} s (the deadline) and was killed")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._died(cell) from None

    def _died(self, cell: Cell | None) -> CellDied:
        self._proc.join(5)
        code = self._proc.exitcode
        self.stop()
        sent = lifetime.signalled_supervisor(code)
        if sent:
            return CellDied(cell, f"was stopped: its design sent {sent} to the process supervising it")
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            return CellDied(cell, f"was killed by signal {name}")
        return CellDied(cell, f"exited with status {code} before its job was done")

    def ask_to_stop(self) -> None:
        """Ask the worker to end once its job is done (:meth:`stop` then waits for it)."""
        if self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)

    def stop(self) -> None:
        """Stop the worker: asked, then killed if not ended within :data:`STOP_WAIT_S`."""
        self.ask_to_stop()
        self.end_by(time.monotonic() + STOP_WAIT_S)

    def end_by(self, until: float) -> None:
        """Wait for the asked worker until ``until`` (``time.monotonic()``), then kill it and its group."""
        if self._proc is None:
            return
        self._proc.join(max(0.0, until - time.monotonic()))
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        with contextlib.suppress(OSError, TypeError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._conn.close()
        self._proc = self._conn = None


class Workers:
    workers: dict[Any, Worker]

    def close(self, at_once: bool = False) -> None:
        """Stop every worker, all asked first, then given :data:`STOP_WAIT_S` together (``at_once``: killed)."""
        workers = list(self.workers.values())
        for worker in workers:
            worker.ask_to_stop()
        until = time.monotonic() + (0.0 if at_once else STOP_WAIT_S)
        for worker in workers:
            worker.end_by(until)

    def __enter__(self):
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self.close(at_once=kind is not None and issubclass(kind, KeyboardInterrupt))


class Pool(Workers):
    """Workers by key (a :class:`WorkerSpec` or share index), started on first use; ``size`` shares, ``limit``
    processes at once."""

    def __init__(self, size: int, execute: Callable[[Any, Events], Any],
                 deadline_s: float = DEFAULT_DEADLINE_S, limit: int = 0) -> None:
        self.size, self.execute, self.deadline_s = max(1, size), execute, deadline_s
        self.limit = limit or self.size
        self.workers: dict[Any, Worker] = {}

    def __len__(self) -> int:
        return self.size

    def worker(self, key: Any, keep: Iterable[Any] = ()) -> Worker:
        """The worker of ``key``; over the limit, the most recently used others not in ``keep`` stop (runs cycle)."""
        code = key.code if isinstance(key, WorkerSpec) else ""
        worker = self.workers.pop(key, None) or Worker(self.execute, self.deadline_s, code)
        keep = {key, *keep}
        spare = [k for k in self.workers if k not in keep]
        for old in spare[::-1][: max(0, len(self.workers) + 1 - self.limit)]:
            self.workers.pop(old).stop()
        self.workers[key] = worker
        return worker

    def run(self, key: Any, job: Any, on_tick: Callable[[str], None] = lambda what: None,
            on_status: Callable[[str], None] = lambda what: None) -> Any:
        return self.worker(key).run(job, on_tick, on_status)

    def close_worker(self, key: Any) -> None:
        """Stop ``key``'s worker."""
        if key in self.workers:
            self.workers[key].stop()
