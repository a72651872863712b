"""The pull-request comment of ``scripts/ci_compare.sh`` (``python -m harness.ci.comment OUT GATE_STATUS AB_STATUS``,
``-`` for a gate left out): both verdicts first, "passed" only when both passed. Design: docs/ci.md#kvblock-bench-ab."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.errors import TooFewPairs

AB_WORDS = {0: "passed", 1: "FAILED", 2: "could not judge: bad input, or nothing comparable",
            TooFewPairs.exit_status: "no verdict: too few pairs for a verdict"}


def gate_lines(doc: dict | None, status: int | None, tail: str) -> list[str]:
    """The gate's lines: its rules' outcomes, its failures."""
    if status is None:
        return ["- gate: left out (KVB_CI_SKIP_GATE)"]
    if not isinstance(doc, dict):
        return [f"- gate: did not finish (exit status {status}): {tail or 'no output'}"]
    rules = doc.get("rules") if isinstance(doc.get("rules"), dict) else {}
    words = list(rules.values())
    counts = [f"{words.count(w)} {w}" for w in ("met", "FAILED", "not measured") if words.count(w)]
    unruled = words.count("no rule")
    counts += [f"no rule for {unruled} of {len(words)} cells"] if unruled else []
    verdict = doc.get("verdict") or ("failed" if status else "checked no rule")
    what = "FAILED" if verdict == "failed" else "incomplete" if verdict == "incomplete" else "rules"
    lines = [f"- gate ({doc.get('config', 'its rules')}): {what}: {'; '.join(counts) or 'no cell measured'}"]
    lines += [f"  - FAIL: {failure}" for failure in doc.get("failures") or []]
    if doc.get("unmeasured"):
        lines.append(f"  - NOT MEASURED: {doc['unmeasured']}")
    return lines


def comment(gate_doc: dict | None, gate_status: int | None, gate_tail: str, ab_status: int, report: str,
            errors: list[str]) -> str:
    """The verdict, the gate's lines, ab's status, ab's report, its error lines."""
    failed = bool(gate_status) or ab_status not in (0, TooFewPairs.exit_status)
    if failed:
        head = "❌ FAILED"
    elif ab_status == TooFewPairs.exit_status:
        head = "⚠️ no verdict: too few pairs for a verdict"
    else:
        head = "✅ passed"
    lines = [f"### kvblock-bench: {head}", "", *gate_lines(gate_doc, gate_status, gate_tail),
             f"- ab (timings, and counts against BASE): {AB_WORDS.get(ab_status, f'exit status {ab_status}')}", ""]
    body = report.strip()
    if body:
        lines += [body.replace("### kvblock-bench compare:", "#### kvblock-bench ab:", 1), ""]
    lines += errors
    return "\n".join(lines).rstrip() + "\n"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    out, gate_status, ab_status = Path(argv[0]), argv[1], int(argv[2])
    try:
        gate_doc = json.loads(_read(out / "gate.json")) if gate_status != "-" else None
    except ValueError:
        gate_doc = None
    tail = next((line for line in reversed(_read(out / "gate.txt").splitlines()) if line.strip()), "")
    errors = [line for line in _read(out / "compare.err").splitlines() if line.startswith("kvblock-bench: error:")]
    print(comment(gate_doc, None if gate_status == "-" else int(gate_status), tail, ab_status,
                  _read(out / "compare.md"), errors), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
