"""The gate against a saved baseline: ``gate --save-baseline FILE`` and ``gate --against FILE``.

A baseline is a gate document (what ``--json`` writes: cells, machine, commit, trace). Callgrind's instruction
counts are exact, so a tight tolerance (``tolerance_pct`` in the configuration, 1 % by default) can fail a rise:
a cell's count moves only with the code, the trace and the software that runs it (Python, NumPy, Numba,
llvmlite: :data:`harness.run.metadata.COUNT_IDENTITY`), and by up to 0.4 % with the other cells measured in
the same valgrind process (``tests/test_gate.py``). A baseline from other software is refused unless allowed;
one from another trace always is.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import InputError
from harness.run.metadata import COUNT_IDENTITY, identity_differences

Cell = tuple[str, str]


def load(path: Path) -> dict:
    """A saved gate document, checked enough to compare against (one-line errors naming the file)."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"--against {path}: no such file; save one with `kvblock-bench gate --save-baseline "
                         f"{path}`") from None
    except (ValueError, OSError) as exc:  # JSON or UTF-8 errors, a folder
        raise InputError(f"--against {path}: not a gate baseline ({exc})") from None
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) and {"impl", "regime"} <= set(c) for c in cells):
        raise InputError(f"--against {path}: not a gate baseline (no list of cells with impl and regime); save one "
                         "with `kvblock-bench gate --save-baseline FILE`")
    return doc


def per_seq_step(cell: dict) -> float | None:
    """Instructions per sequence-step of a saved cell (the first callgrind run's), None if not measured."""
    counts, seq_steps = cell.get("instructions"), cell.get("seq_steps")
    if not counts or not seq_steps:
        return None
    return counts[0] / seq_steps


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
        if key not in old:
            notes.append(f"{key[0]} {key[1]}: not in the baseline")
            continue
        failure, note = compare_cell(key, old[key], cell, tolerance_pct)
        failures += [failure] if failure else []
        notes += [note] if note else []
    if baseline.get("commit"):
        notes.append(f"baseline: commit {baseline['commit']}, tolerance {tolerance_pct:g} %")
    return failures, notes
