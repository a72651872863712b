"""The batched entry points' inputs are read-only; ``table_nbytes`` and ``memory_bytes`` answer byte counts."""

from __future__ import annotations

import numpy as np

from impls.contract import ALLOCATE, CAN_ALLOCATE, FREE, STEP_EXTRA, table_nbytes_problem

CONFIG = {"num_blocks": 64, "block_size": 4, "max_seqs": 8, "max_blocks_per_seq": 8}
BATCH = (5, 2, 7, 0, 3)  # distinct and out of order: writing into them in place always shows
STEP_OPS = ((CAN_ALLOCATE, 2, 0), (ALLOCATE, 1, 6), (FREE, 1, 0))


def input_problems(cls: type) -> list[str]:
    """What a fresh ``cls`` does wrong with its batched calls' inputs or ``table_nbytes`` (empty: nothing)."""
    mgr = cls(**CONFIG)
    for n, seq in enumerate(BATCH):
        mgr.allocate(seq, 3 + n)
    n = len(BATCH)
    ids, cow_out, slot_out = np.array(BATCH, np.int64), np.zeros((n, 2), np.int64), np.zeros(n, np.int64)
    problems = [_changed("decode_step", {"seq_ids": ids}, lambda: mgr.decode_step(ids, cow_out, slot_out)),
                _changed("lookup", {"seq_ids": ids}, lambda: mgr.lookup(ids, slot_out))]
    if callable(getattr(mgr, "step", None)):
        ops, a0, a1 = (np.array(column, np.int64) for column in zip(*STEP_OPS, strict=True))
        status_out = np.zeros(len(STEP_OPS) + STEP_EXTRA, np.int64)
        inputs = {"ops": ops, "a0": a0, "a1": a1, "seq_ids": ids}
        problems.append(_changed("step", inputs, lambda: mgr.step(ops, a0, a1, ids, status_out, cow_out, slot_out)))
    problems += [f"{problem} for sequence {seq}" for seq in BATCH
                 if (problem := table_nbytes_problem(mgr.table_nbytes(seq)))]
    problems.append(memory_bytes_problem(mgr))
    return [problem for problem in problems if problem]


def memory_bytes_problem(mgr) -> str:
    """What is wrong with ``mgr.memory_bytes()``'s answer ("" if nothing or no such method)."""
    if getattr(type(mgr), "memory_bytes", None) is None:
        return ""
    value = mgr.memory_bytes()
    if type(value) is int and value >= 0:
        return ""
    shown = repr(value)[:80] if isinstance(value, (int, float, str, bytes, type(None))) else type(value).__name__
    return f"memory_bytes() returned {shown}, not a byte count (an int, 0 or more)"


def _changed(call: str, inputs: dict[str, np.ndarray], run) -> str:
    """Run ``run()``; what of ``inputs`` it changed, in words ("" when nothing)."""
    before = {name: array.copy() for name, array in inputs.items()}
    run()
    changed = [name for name, array in inputs.items() if not np.array_equal(array, before[name])]
    words = [f"{name} {before[name].tolist()} became {inputs[name].tolist()}" for name in changed]
    for name in changed:
        inputs[name][:] = before[name]
    return f"{call} wrote into its inputs ({'; '.join(words)}): they are read-only" if changed else ""
