"""The contract checker's quick form on every plug-in before a run times it (``kvblock-bench check``, with
:data:`QUICK`), each in a worker of its own: a design that does not conform is still measured, but its rows say so
(the ``conformance`` column), and so do meta.json, the console and the reports."""

from __future__ import annotations

import time
from dataclasses import dataclass

from harness.run.jobs import CheckJob, execute
from harness.run.workers import CellDied, Worker, WorkerBug

QUICK = CheckJob("", seeds=1, examples=20, ops=20)  # the quick form's size (the name is each plug-in's)
CONFORMS, FAILS = "conforms", "fails"
WHY_CHARS = 300


@dataclass
class Checked:
    """A plug-in's verdict (:data:`CONFORMS` or :data:`FAILS`), the checker's first line of why, its seconds."""

    verdict: str
    why: str
    seconds: float

    def record(self) -> dict:
        """What meta.json keeps of it."""
        return {"verdict": self.verdict, "why": self.why, "seconds": round(self.seconds, 1), "form": describe()}


def describe() -> str:
    """The quick form in words."""
    return (f"kvblock-bench check --seeds {QUICK.seeds} --examples {QUICK.examples} --ops {QUICK.ops}: random call "
            "sequences against the reference model at block sizes 1 to 64, the input probe and the 65,536-block pool")


def check_plugins(names: list[str], deadline_s: float) -> dict[str, Checked]:
    """The quick form's verdict on each plug-in of ``names``, each in a fresh worker stopped afterwards (the
    checker's objects never share a process with the design's timings)."""
    return {name: _check(name, deadline_s) for name in names}


def _check(name: str, deadline_s: float) -> Checked:
    started, worker = time.monotonic(), Worker(execute, deadline_s)
    try:
        result = worker.run(CheckJob(name, QUICK.seeds, QUICK.examples, QUICK.ops))
        ok, text = result.ok, result.text
    except CellDied as died:
        ok, text = False, f"the checking process {died.reason}"
    except WorkerBug as bug:  # in the plug-in's own process: its answers made the checker fail
        ok, text = False, f"the checker could not use its answers ({bug.last_line()})"
    finally:
        worker.stop()
    return Checked(CONFORMS if ok else FAILS, "" if ok else _why(text), time.monotonic() - started)


def _why(text: str) -> str:
    """The checker's first finding in one line: a failing sequence (``seed 0, ...: Error: ...``), the input probe's or
    the full pool's, else its first line (a failure to load or run it)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = next((line for line in lines if line.startswith(("seed ", "inputs: ", "full pool: "))),
                 lines[0] if lines else "")
    return found if len(found) <= WHY_CHARS else found[: WHY_CHARS - 1] + "…"
