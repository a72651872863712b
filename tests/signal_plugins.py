"""Stand-ins for the signal tests: worker jobs and plug-ins that signal the process supervising them, or their own
process group, and jobs that wait to be interrupted."""

from __future__ import annotations

import os
import signal
import time

from tests.hostile_plugins import DictBlockManager

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


def signalling_job(job: tuple[str, str], events) -> str:
    """A worker's job that sends ``job[1]`` to its supervisor (``job[0]`` "parent") or its own group ("group")
    from inside a cell, then goes on as if nothing happened."""
    target, name = job
    events.cell(("signals", "batched"))
    if target == "parent":
        os.kill(os.getppid(), SIGNALS[name])
    else:
        os.killpg(0, SIGNALS[name])
    time.sleep(1)
    events.cell(None)
    return "went on"


def hanging_job(job: object, events) -> None:
    """Hangs inside a cell (the supervisor must be killed)."""
    events.cell(("hangs", "batched"))
    while True:
        time.sleep(0.1)


class HangsAtOnce(DictBlockManager):
    """Hangs in its constructor."""

    def __init__(self, *args, **kwargs) -> None:
        while True:
            time.sleep(0.1)
