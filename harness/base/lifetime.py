"""Processes of ours end with their parent; a design cannot stop the process supervising it (the shield).
Design: docs/measurement.md#interrupts-scratch-and-lifetime."""

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
TERMINATING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                         signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE})
SIGNALLED_SUPERVISOR = 200  # the shield's exit status, plus the signal's number: the design sent it that signal
WATCHED = {*TERMINATING, signal.SIGCHLD}
POLL_S = 1.0


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
    """Ask the kernel for ``sig`` when this process's parent ends (Linux); False where it cannot."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def tied_to_me() -> Callable[[], None]:
    """A ``preexec_fn`` for :mod:`subprocess`: the child is killed when this process ends."""
    parent = os.getpid()

    def tie() -> None:
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return tie


def shield() -> None:
    """Fork: returns in the child (the worker); the parent becomes the shield and never returns."""
    supervisor = os.getppid()
    with contextlib.suppress(OSError):
        os.setpgrp()  # the worker and whatever it starts: one group, the supervisor stops it at once
    before = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
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
    with contextlib.suppress(OSError):  # a small interpreter of its own: the worker's memory stays the worker's
        os.execv(sys.executable, [sys.executable, "-I", "-S", __file__, str(worker), str(supervisor)])
    _guard(worker, supervisor)


def _guard(worker: int, supervisor: int) -> NoReturn:
    """Wait for the worker; end the group on the supervisor's signals, the worker on its own group's."""
    while True:
        info = signal.sigtimedwait(WATCHED, POLL_S)
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
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return True


def _kill_worker(worker: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)
    for pid in _group_members():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _group_members() -> list[int]:
    group, me, found = os.getpgrp(), os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                with contextlib.suppress(OSError):
                    if os.getpgid(int(entry)) == group:
                        found.append(int(entry))
    return found


def signalled_supervisor(exitcode: int | None) -> str | None:
    """The signal a worker's design sent its supervisor, from the shield's exit status, or None."""
    sig = (exitcode or 0) - SIGNALLED_SUPERVISOR
    return signal.Signals(sig).name if sig in {int(s) for s in TERMINATING} else None


def _end_group(sig: int) -> NoReturn:
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGKILL)
    _end_by(sig)


def _end_by(sig: int) -> NoReturn:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(ValueError, OSError):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _end_as(status: int) -> NoReturn:
    if os.WIFSIGNALED(status):
        _end_by(os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":  # the shield, once it has forked the worker: WORKER SUPERVISOR
    _guard(int(sys.argv[1]), int(sys.argv[2]))
