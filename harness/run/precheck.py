"""The contract checker's quick form (:data:`QUICK`) on every plug-in before a run times it.
Design: docs/failures.md#verdicts-a-reader-must-not-misread."""

from __future__ import annotations

import time
from dataclasses import dataclass

from harness.run.jobs import CheckJob, execute
from harness.run.workers import CellDied, Worker, WorkerBug

QUICK = CheckJob("", seeds=1, examples=20, ops=20)
CONFORMS, FAILS = "conforms", "fails"
WHY_CHARS = 300


@dataclass
class Checked:
    """A plug-in's verdict, the checker's first finding, its seconds."""

    verdict: str
    why: str
    seconds: float

    def record(self) -> dict:
        return {"verdict": self.verdict, "why": self.why, "seconds": round(self.seconds, 1), "form": describe()}


def describe() -> str:
    return (f"kvblock-bench check --seeds {QUICK.seeds} --examples {QUICK.examples} --ops {QUICK.ops}: random call "
            "sequences against the reference model at block sizes 1 to 64, the input probe and the 65,536-block pool")


def check_plugins(names: list[str], deadline_s: float) -> dict[str, Checked]:
    """The quick form's verdict on each of ``names``, each in a fresh worker (never the timing one)."""
    return {name: _check(name, deadline_s) for name in names}


def _check(name: str, deadline_s: float) -> Checked:
    started, worker = time.monotonic(), Worker(execute, deadline_s)
    try:
        result = worker.run(CheckJob(name, QUICK.seeds, QUICK.examples, QUICK.ops))
        ok, text = result.ok, result.text
    except CellDied as died:
        ok, text = False, f"the checking process {died.reason}"
    except WorkerBug as bug:
        ok, text = False, f"the checker could not use its answers ({bug.last_line()})"
    finally:
        worker.stop()
    return Checked(CONFORMS if ok else FAILS, "" if ok else _why(text), time.monotonic() - started)


def _why(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = next((line for line in lines if line.startswith(("seed ", "inputs: ", "full pool: "))),
                 lines[0] if lines else "")
    return found if len(found) <= WHY_CHARS else found[: WHY_CHARS - 1] + "…"
