"""scripts/sglang_drivings.py: the drivings of SGLang's allocator it sets side by side (issue 50, item 5), checked on
our model of the allocator (the script runs SGLang's own from its wheel; tests do not fetch it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from harness.base.drivers import Prepared
from scenarios import generate

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sglang_drivings.py"
spec = importlib.util.spec_from_file_location("sglang_drivings", SCRIPT)
drivings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(drivings)


def _extends(per_admission: bool, prep: Prepared) -> tuple[list[int], object]:
    from impls.contenders.sglang import PagedAllocator

    cfg = prep.trace.config
    alloc = PagedAllocator(cfg["num_blocks"] * cfg["block_size"], cfg["block_size"])
    calls, real = [], alloc.alloc_extend
    alloc.alloc_extend = lambda prefix, *a: calls.append(len(prefix)) or real(prefix, *a)
    sched = drivings.Scheduler(torch, alloc, prep, per_admission)
    for s in range(prep.num_steps):
        assert sched.step(s) >= 0
    return calls, sched


def test_the_independent_driver_extends_per_admission_or_per_prefill_batch() -> None:
    """One alloc_extend per admission, or one per step that admits (all its admissions in it); either way the
    rows end the same, and as long as the trace's."""
    prep = Prepared.from_trace(generate("paper", steps=30, running=16, num_blocks=2048))
    one, by_one = _extends(True, prep)
    batch, by_batch = _extends(False, prep)
    admits = [sum(1 for i in range(first, mid) if prep.op[i] == drivings.ALLOCATE) for first, mid, _ in prep.bounds]
    assert one == [1] * sum(admits) and batch == [n for n in admits if n]
    assert by_one.lens == by_batch.lens
    final = np.zeros(prep.trace.config["max_seqs"], dtype=int)
    for s, (first, mid, _) in enumerate(prep.bounds):
        for i in range(first, mid):
            if prep.op[i] in (drivings.ALLOCATE, drivings.FREE):
                final[prep.a0[i]] = prep.a1[i] if prep.op[i] == drivings.ALLOCATE else 0
        final[prep.decode_ids[s]] += 1
    assert by_batch.lens == final.tolist()


def test_each_pair_is_a_ratio_row_of_its_own() -> None:
    names = {n for pair in drivings.PAIRS for n in pair}
    figures = {n: (100.0 + i, [100.0 + i, 110.0 + i]) for i, n in enumerate(sorted(names))}
    found = {n: ("step" if "adapter" in n or "contender" in n else "allocator", None, None) for n in names}
    rows = drivings.rows(figures, {}, found, 10, "1.00-1.00", "cmd")
    assert [r["variant"] for r in rows if not r["vs"]] == list(figures)
    pairs = [(r["variant"], r["vs"]) for r in rows if r["vs"]]
    assert pairs == list(drivings.PAIRS)
    for r in rows:
        if r["vs"]:
            assert float(r["ratio"]) == pytest.approx(figures[r["variant"]][0] / figures[r["vs"]][0], abs=6e-4)
            assert set(r) == set(drivings.COLUMNS)
