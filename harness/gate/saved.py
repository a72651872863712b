"""The gate against a saved baseline (``gate --save-baseline FILE``, ``gate --against FILE``): a rise beyond the
tolerance fails; a baseline of other software is refused unless allowed, of another trace always (docs/ci.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from harness.base.replay import REGIMES
from harness.errors import InputError
from harness.run.metadata import COUNT_IDENTITY, identity_differences

Cell = tuple[str, str]


def load(path: Path) -> dict:
    """A saved gate document, every field compared checked (one-line errors naming the file and the field)."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"--against {path}: no such file; save one with `kvblock-bench gate --save-baseline "
                         f"{path}`") from None
    except (ValueError, OSError) as exc:  # JSON or UTF-8 errors, a folder
        raise InputError(f"--against {path}: not a gate baseline ({exc})") from None
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        problem = "no list of cells with impl and regime"
    else:
        problem = document_problem(doc)
    if problem:
        raise InputError(f"--against {path}: not a gate baseline ({problem}); save one with `kvblock-bench gate "
                         "--save-baseline FILE`")
    return doc


def _positive(value: object) -> bool:
    """A finite number above 0 (a bool is no number here)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _rate(value: object) -> bool:
    return value is None or value == 0 or _positive(value)


# A saved cell's fields: (required, sound, what it must be).
CELL_FIELDS: dict[str, tuple[bool, Callable[[object], bool], str]] = {
    "impl": (True, lambda v: isinstance(v, str) and bool(v.strip()), "an implementation name (a string)"),
    "regime": (True, lambda v: isinstance(v, str) and v in REGIMES, f"one of {', '.join(REGIMES)}"),
    "instructions": (True, lambda v: isinstance(v, list) and bool(v) and all(map(_positive, v)),
                     "a list of instruction counts, each above 0"),
    "seq_steps": (True, lambda v: isinstance(v, int) and _positive(v), "a whole number of sequence-steps above 0"),
    "layouts": (False, lambda v: v is None or (isinstance(v, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)), "a list of heap layouts (0 or more)"),
    "memray_per_step": (False, _rate, "allocations per step, 0 or more (or null)"),
    "nrt_per_step": (False, _rate, "allocations per step, 0 or more (or null)"),
}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def cell_problem(cell: dict) -> str:
    """What is wrong with a saved cell's first unsound field, in words ("" when none is)."""
    for key, (required, sound, need) in CELL_FIELDS.items():
        if key not in cell:
            if required:
                return f"{key} is missing"
        elif not sound(cell[key]):
            return f"{key} must be {need}, got {_shown(cell[key])}"
    return ""


def document_problem(doc: dict) -> str:
    """The first field of a gate document that cannot be compared against, in words ("" when all can)."""
    if not isinstance(doc.get("trace_checksum"), str):
        return f"trace_checksum must be the trace's checksum (a string), got {_shown(doc.get('trace_checksum'))}"
    if not isinstance(doc.get("machine", {}), dict) or not isinstance(doc.get("commit", ""), str | None):
        return "machine must be an object and commit a string"
    if not doc["cells"]:
        return "cells: no cell"
    seen = set()
    for i, cell in enumerate(doc["cells"]):
        problem = cell_problem(cell)
        if problem:
            return f"cells[{i}].{problem}"
        if (cell["impl"], cell["regime"]) in seen:
            return f"cells[{i}]: {cell['impl']} {cell['regime']} is given twice"
        seen.add((cell["impl"], cell["regime"]))
    return ""


def per_seq_step(cell: dict) -> float | None:
    """Instructions per sequence-step of a saved cell (its runs' fewest), None if not measured."""
    counts, seq_steps = cell.get("instructions"), cell.get("seq_steps")
    if not counts or not seq_steps:
        return None
    return min(counts) / seq_steps


def refusal(baseline: dict, current: dict, path: Path, allow_other_machine: bool) -> str:
    """Why the baseline cannot be compared with this gate ("" when it can): another trace, or other software
    (unless allowed)."""
    if baseline.get("trace_checksum") != current.get("trace_checksum"):
        return (f"--against {path}: measured on another trace ({baseline.get('trace_checksum')} against "
                f"{current.get('trace_checksum')}); save a baseline with this trace")
    differences = identity_differences(baseline.get("machine") or {}, current["machine"], COUNT_IDENTITY)
    if differences and not allow_other_machine:
        return (f"--against {path}: made with other software ({'; '.join(differences)}): instruction counts "
                "compare only under the same Python, NumPy, Numba and llvmlite; pass --allow-other-machine to "
                "compare anyway")
    return ""


def _zero(cell: dict) -> bool:
    return cell.get("memray_per_step") == 0 and cell.get("nrt_per_step") == 0


def compare_cell(key: Cell, old: dict, new: dict, tolerance_pct: float) -> tuple[str, str]:
    """(failure, note) for one cell measured in both: a rise in instructions beyond the tolerance, or
    allocations where the baseline had none, fails; a fall beyond it is a note (update the baseline)."""
    name = f"{key[0]} {key[1]}"
    if _zero(old) and new.get("memray_per_step") is not None and not _zero(new):
        return (f"{name} allocates now ({new.get('memray_per_step'):g} ({new.get('alloc_source') or 'memray'}), "
                f"{new.get('nrt_per_step'):g} "
                "Numba runtime allocations per step); the baseline allocated nothing"), ""
    before, now = per_seq_step(old), per_seq_step(new)
    if before is None or now is None:
        return "", f"{name}: no instruction count {'in the baseline' if before is None else 'now'}"
    change = (now / before - 1) * 100
    if change > tolerance_pct + 1e-9:  # exactly on the tolerance passes, whatever the float rounding
        return (f"{name} needs {now:,.1f} instructions per sequence-step, {change:+.2f} % against the baseline's "
                f"{before:,.1f} (tolerance {tolerance_pct:g} %)"), ""
    if change < -tolerance_pct - 1e-9:
        return "", f"{name}: {now:,.1f} instructions per sequence-step, {change:+.2f} % (save a new baseline)"
    return "", ""


def against(baseline: dict, current: dict, tolerance_pct: float) -> tuple[list[str], list[str]]:
    """(failures, notes) of the current gate document against the baseline, cell by cell."""
    old = {(c["impl"], c["regime"]): c for c in baseline["cells"]}
    failures, notes = [], []
    for cell in current["cells"]:
        key = (cell["impl"], cell["regime"])
        if key not in old:  # nothing to hold it to: it would pass whatever it counts
            failures.append(f"{key[0]} {key[1]}: not in the baseline, so nothing holds it; save a baseline that "
                            "has it (gate --save-baseline) or leave it out (--impl)")
            continue
        failure, note = compare_cell(key, old[key], cell, tolerance_pct)
        failures += [failure] if failure else []
        notes += [note] if note else []
    if baseline.get("commit"):
        notes.append(f"baseline: commit {baseline['commit']}, tolerance {tolerance_pct:g} %")
    return failures, notes
