"""Processes of ours never outlive their parent, and a design cannot stop the process that supervises it.

A child asks the kernel for a signal when its parent ends (Linux ``prctl(PR_SET_PDEATHSIG)``), so a supervisor
killed outright (SIGKILL, the out-of-memory killer) leaves nothing running; every other exit of the supervisor
stops its children itself. Where the system has no such call this does nothing.

A worker runs designs' code, which may signal the process that started it (``os.kill(os.getppid(), SIGTERM)``)
or its own process group. So the supervisor starts a *shield*, and the shield forks the worker (:func:`shield`):
the shield leads the worker's process group, waits for the worker and ends as it ended. A terminating signal
from the supervisor (stopping it; the kernel when the supervisor died) ends the shield's whole group; from the
worker's own group (the design, its helpers) it ends the worker, and the shield exits with
:data:`SIGNALLED_SUPERVISOR` plus the signal's number, which the supervisor reports as the design's doing. A design
that signals its own group ends only its worker. Either way it costs only its own cells.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

PR_SET_PDEATHSIG = 1
# What would end the shield by default, and so what it takes only from its supervisor.
TERMINATING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                         signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE})
SIGNALLED_SUPERVISOR = 200  # the shield's exit status, plus the signal's number: the design sent it that signal
POLL_S = 1.0  # the shield looks at its worker at least this often, whatever the signals say


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    call.restype = ctypes.c_int
    return call


_PRCTL = _prctl()  # looked up once: a child calls it between fork and exec, where nothing should be loaded


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel for ``sig`` when this process's parent ends; False where it cannot."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def tied_to_me() -> Callable[[], None]:
    """A ``preexec_fn`` for :mod:`subprocess`: the child is killed when this process ends (also when it already
    had, between the fork and the call)."""
    parent = os.getpid()

    def tie() -> None:
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return tie


def shield() -> None:
    """Fork: returns in the child, the worker, tied to the shield; the parent becomes the shield and never
    returns (it ends as the worker ends, or with its group: see the module's docstring)."""
    supervisor = os.getppid()
    with contextlib.suppress(OSError):
        os.setpgrp()  # the worker and whatever it starts: one group, the supervisor stops it at once
    watched = {*TERMINATING, signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    die_with_parent(signal.SIGTERM)
    if os.getppid() != supervisor:  # the supervisor ended before the request
        _end_group(signal.SIGTERM)
    me = os.getpid()
    worker = os.fork()
    if worker == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        die_with_parent(signal.SIGKILL)
        if os.getppid() != me:
            os._exit(1)
        return
    _guard(worker, supervisor, watched)


def _guard(worker: int, supervisor: int, watched: set[int]) -> NoReturn:
    """The shield's life: wait for the worker; act on the supervisor's signals only."""
    while True:
        info = signal.sigtimedwait(watched, POLL_S)
        done, status = os.waitpid(worker, os.WNOHANG)
        if done:
            _end_as(status)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if info.si_pid in (supervisor, 0) or not _ours(info.si_pid):
            _end_group(info.si_signo)
        _kill_worker(worker)
        os._exit(SIGNALLED_SUPERVISOR + info.si_signo)


def _ours(pid: int) -> bool:
    """Whether ``pid`` is of the shield's group (the worker or what it started), or gone already (a design's
    ``kill`` command is gone by the time its signal is read)."""
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return True


def _kill_worker(worker: int) -> None:
    """Kill the worker and whatever it started (the shield's group but the shield), and reap it."""
    with contextlib.suppress(OSError):
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)
    for pid in _group_members():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _group_members() -> list[int]:
    """The other live processes of the shield's group (read from /proc; none where it is unreadable)."""
    group, me, found = os.getpgrp(), os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                with contextlib.suppress(OSError):
                    if os.getpgid(int(entry)) == group:
                        found.append(int(entry))
    return found


def signalled_supervisor(exitcode: int | None) -> str | None:
    """The signal a worker's design sent its supervisor, from the shield's exit status (None: it sent none)."""
    sig = (exitcode or 0) - SIGNALLED_SUPERVISOR
    return signal.Signals(sig).name if sig in {int(s) for s in TERMINATING} else None


def _end_group(sig: int) -> NoReturn:
    """End the shield's whole group (the worker and its helpers), the shield by ``sig``."""
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGKILL)
    _end_by(sig)


def _end_by(sig: int) -> NoReturn:
    """End this process by ``sig`` (no core file), as the default action would."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(ValueError, OSError):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _end_as(status: int) -> NoReturn:
    """End as the worker ended: by its signal, or with its exit status."""
    if os.WIFSIGNALED(status):
        _end_by(os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))
