"""Where a design's instructions go: callgrind's per-function counts of the gate's regions, by kind of work.
Design: docs/measurement.md#where-where-the-instructions-go."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.counters.callgrind import CallgrindUnavailable, dump_files, dump_regions
from harness.counters.symbols import names

# Kinds of work, in the table's order, and the functions that do them: the first pattern to match a function's
# name wins (compiled functions are named from harness.counters.symbols). Numba inlines the pool operations'
# kernels into the replay loop; both flat designs fuse checks and table work into one decode pass.
KINDS = ("replay loop", "decode step", "pool ops", "containers", "runtime", "interpreter", "other")
RULES = (
    (r"replay_loop|\.spread\b|kvb_replay|check_slice|pool_op|kvb_alloc_count|libffi", "replay loop"),
    (r"decode_step|fused_step|slow_slot|append_unchecked|last_slot", "decode step"),
    (r"kvb_(can_allocate|allocate|free|fork)\b|::(can_allocate|allocate|free|fork)\(|"
     r"\.(can_allocate|allocate|free|fork)$", "pool ops"),
    (r"numba\.typed|numba_(dict|list)|_helperlib|memcmp|std::(__detail|_Hashtable|vector)|_Prime_rehash",
     "containers"),
    (r"NRT_|mem(cpy|move|set)|malloc|_int_free|\bfree\b|cfree|operator (new|delete)", "runtime"),
    (r"Python-3|libpython|numpy", "interpreter"),
)
_LINE = re.compile(r"^\s*(-?[\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$")


def kind_of(name: str) -> str:
    """The kind of work of a function named as callgrind_annotate prints it (``file:function [object]``)."""
    return next((kind for pattern, kind in RULES if re.search(pattern, name)), "other")


def function_counts(dump: Path, symbols: dict[str, str]) -> dict[str, int]:
    """Instructions per function (exclusive) in one dump, compiled functions named from ``symbols``."""
    tool = shutil.which("callgrind_annotate")
    if tool is None:
        raise CallgrindUnavailable("callgrind_annotate is not installed (it comes with valgrind)")
    out = subprocess.run([tool, "--inclusive=no", "--threshold=100", str(dump)], capture_output=True, text=True,
                         check=True).stdout
    counts: dict[str, int] = {}
    body = out.split("file:function", 1)[-1]
    for line in body.splitlines():
        match = _LINE.match(line)
        if match:
            name = match.group(2)
            address = re.search(r"0x[0-9a-f]{16}", name)
            if address and address.group(0) in symbols:
                name = symbols[address.group(0)]
            counts[name] = counts.get(name, 0) + int(match.group(1).replace(",", ""))
    return counts


def breakdown(trace: Path, cells: list[tuple[str, str]], warm_steps: int, steps: int) -> dict:
    """Per cell: instructions per sequence-step by kind of work (region minus empty region, per function), and
    the functions that account for them."""
    with tempfile.TemporaryDirectory(prefix="kvb-where-") as tmp:
        out = Path(tmp)
        seq_steps = dump_regions(trace, cells, warm_steps, steps, out)
        symbols = names(json.loads((out / "layouts.json").read_text()), json.loads((out / "starts.json").read_text()))
        files = dump_files(out / "callgrind.out")
        result = {}
        for impl, regime in cells:
            region = function_counts(files[f"{impl}|{regime}|{steps}"], symbols)
            empty = function_counts(files[f"{impl}|{regime}|0"], symbols)
            diff = {name: region.get(name, 0) - empty.get(name, 0) for name in {*region, *empty}}
            kinds = dict.fromkeys(KINDS, 0.0)
            for name, ir in diff.items():
                kinds[kind_of(name)] += ir / seq_steps
            top = sorted(diff.items(), key=lambda item: -abs(item[1]))[:6]
            result[f"{impl} {regime}"] = {"per_kind": kinds, "total": sum(kinds.values()),
                                          "functions": {name: ir / seq_steps for name, ir in top}}
        return result

