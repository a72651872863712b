"""How long each ``make`` target takes, as measured (``results/times/times.json``), and the words quoting it.
Design: docs/output.md#harnessoutputtimespy."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.base.files import atomic_write_text
from harness.base.host import machine_name
from harness.base.project import TIMES_JSON
from harness.base.text import duration_text
from harness.output.markdown import markdown_table

RELATIVE = "results/times/times.json"
FORMAT = 1
BEGIN, END = "<!-- times:begin -->", "<!-- times:end -->"
# The targets a user runs, in the order the README lists them, with what each does in a few words.
TARGETS = {
    "setup": "create .venv and install the project (fresh .venv)",
    "test": "the test-suite and ruff",
    "bench-quick": "the reduced matrix (short traces, one repetition), with figures",
    "bench": "the default matrix, with figures",
    "bench-ci": "the CI profile: every implementation on paper, batched and step regimes",
    "gate": "the deterministic CI gate (allocations, callgrind, wall-clock floor)",
    "test-slow": "the long tests",
}


class TimesError(ValueError):
    """A times file that cannot be read; the message names the file and the problem."""


@dataclass
class TargetTime:
    """One target's measurement: ``wall_s`` and ``cpu_s`` (children's user + system) when it exited 0."""

    target: str
    command: str
    returncode: int
    wall_s: float | None
    cpu_s: float | None
    started: str
    commit: str
    caches: str
    load_1m: float | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.wall_s is not None


@dataclass
class Times:
    """The file: the machine it was measured on, and the targets (latest measurement of each)."""

    machine: dict
    targets: list[TargetTime] = field(default_factory=list)
    format: int = FORMAT

    def get(self, target: str) -> TargetTime | None:
        return next((t for t in self.targets if t.target == target), None)

    def put(self, measured: TargetTime) -> None:
        """Replace the target's earlier measurement (if any) by ``measured``, keeping the file's order."""
        self.targets = [t for t in self.targets if t.target != measured.target] + [measured]
        order = list(TARGETS)
        self.targets.sort(key=lambda t: order.index(t.target) if t.target in order else len(order))


def read_times(path: Path = TIMES_JSON) -> Times | None:
    """The times file, or None when there is none yet; :class:`TimesError` when it cannot be trusted."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise TimesError(f"{path}: format {data.get('format')!r}, this code reads format {FORMAT}")
        return Times(dict(data["machine"]), [TargetTime(**t) for t in data["targets"]])
    except (ValueError, KeyError, TypeError) as exc:
        raise TimesError(f"{path}: not a times file ({exc}); rewrite it with scripts/make_times.py") from None


def quoted_times(path: Path = TIMES_JSON) -> Times | None:
    """The times file for words that quote it (``--help``); None when missing or unreadable."""
    try:
        return read_times(path)
    except TimesError:
        return None


def write_times(times: Times, path: Path = TIMES_JSON) -> None:
    """Write the times file atomically (an interrupted measurement never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(asdict(times), indent=2, sort_keys=True) + "\n")


def took(entry: TargetTime | None) -> str:
    """``M min S s`` (wall), or why there is no time."""
    if entry is None:
        return "not timed yet"
    if not entry.ok:
        return f"failed (exit status {entry.returncode}) when timed"
    return duration_text(entry.wall_s)


def phrase(target: str, times: Times | None) -> str:
    """``make TARGET took M min S s on the reference machine (results/times/times.json)``."""
    entry = times.get(target) if times else None
    if entry is None or not entry.ok:
        return f"`make {target}`: {took(entry)} (python scripts/make_times.py measures it into {RELATIVE})"
    return f"`make {target}` took {took(entry)} on the reference machine ({RELATIVE})"


def help_epilog(times: Times | None) -> str:
    """One line per target for ``kvblock-bench --help``."""
    head = f"time of each make target on the reference machine ({RELATIVE}):"
    if times is None:
        return f"{head} not measured yet (python scripts/make_times.py)"
    return head + "".join(f" make {t.target} {took(t)};" for t in times.targets).rstrip(";")


def _cpu(entry: TargetTime) -> str:
    return duration_text(entry.cpu_s) if entry.ok and entry.cpu_s is not None else "—"


def section(times: Times | None) -> str:
    """The README's generated time table (between :data:`BEGIN` and :data:`END`)."""
    if times is None or not times.targets:
        return (f"Not measured yet: `python scripts/make_times.py` times each `make` target on a quiet machine and "
                f"writes `{RELATIVE}`, from which this table and `kvblock-bench --help` are generated.")
    m = times.machine
    lines = [f"Measured by `python scripts/make_times.py` on {machine_name(m)} (`{RELATIVE}`); wall time, and the "
             "CPU time of the target's processes (two cores can run "
             "two at once). Caches `cold`: the Numba cache, the C++ build and the trace cache removed before the "
             "target, as on a fresh clone; `warm`: left as the previous target left them.", ""]
    rows = [[f"`{t.command}`", TARGETS.get(t.target, ""), took(t), _cpu(t), t.caches,
             "—" if t.load_1m is None or math.isnan(t.load_1m) else f"{t.load_1m:.2f}",
             f"`{t.commit}`, {t.started[:10]}"] for t in times.targets]
    header = ["command", "what it does", "wall time", "CPU time", "caches", "load when started", "commit, date"]
    return "\n".join([*lines, *markdown_table(header, rows)])
