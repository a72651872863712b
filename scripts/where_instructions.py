"""Where each design family's instructions go in the gate's regions: callgrind's per-function counts of every
cell (region minus empty region, per sequence-step), by kind of work (``harness/counters/where.py``).

Usage: python scripts/where_instructions.py [--out DIR] [--docs FILE]

Writes ``DIR/where.json`` (per cell: the kinds, their total, its heaviest functions) and ``DIR/where.md`` (the
table), atomically, and puts the table between the ``where:begin``/``where:end`` markers of ``--docs``. The
counts are callgrind's, so they do not depend on the machine's load. Defaults: ``results/where`` and
``docs/measurement.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.base.files import atomic_write_text, write_json
from harness.counters import where
from harness.gate import command as gate
from harness.output.markdown import markdown_table
from harness.run.metadata import git_commit

ROOT = Path(__file__).resolve().parents[1]
CELLS = [(impl, "batched") for impl in ("flat", "cpp-flat", "flat-rows", "cpp-flat-rows", "dict-jit", "cpp-dict",
                                         "list-jit", "cpp-list", "dict", "list")]
BEGIN, END = "<!-- where:begin -->", "<!-- where:end -->"


def markdown(result: dict) -> str:
    """The table: one row per cell, instructions per sequence-step by kind of work, and the total."""
    rows = [[cell, *(f"{figures['per_kind'][k]:.1f}" for k in where.KINDS), f"{figures['total']:.1f}"]
            for cell, figures in result.items()]
    return "\n".join(markdown_table(["cell", *where.KINDS, "total"], rows)) + "\n"


def with_table(text: str, table: str) -> str:
    """``text`` with ``table`` between its markers (ValueError when they are missing)."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the markers {BEGIN} and {END} are missing")
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "where")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "measurement.md")
    args = parser.parse_args(argv)
    result = where.breakdown(gate.TRACE, CELLS, gate.WARM_STEPS, gate.STEPS)
    table = markdown(result)
    write_json(args.out / "where.json", {"commit": git_commit(), "trace": str(gate.TRACE.name),
                                         "warm_steps": gate.WARM_STEPS, "steps": gate.STEPS, "cells": result})
    atomic_write_text(args.out / "where.md", table)
    atomic_write_text(args.docs, with_table(args.docs.read_text(), table))
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
