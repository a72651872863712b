"""Block-id width: the batched slot lookup over uint16, int32 and int64 tables. Design: docs/measurement.md#idwidth."""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from harness.base.drivers import Prepared, step_runner
from harness.base.replay import apply_pool_op
from harness.base.rows import Row
from harness.base.stats import median_estimate
from impls.core.ids import UINT16_LIMIT
from impls.designs.flat import FlatBlockManager
from scenarios import PAPER, Trace, generate

IMPL = "flat"  # the design whose table is stored at each id width

DTYPES = (np.uint16, np.int32, np.int64)
STEPS = 200
LARGE_SEQS = 32768
TARGET_NS = 2_000_000
RUNS = 15
SOURCE = "perf_counter_ns"


@njit(cache=True)
def _lookup_loop(table, lens, seq_ids, shift, reps, slot_out):
    mask = (np.int64(1) << shift) - 1
    n = seq_ids.shape[0]
    acc = np.int64(0)
    for r in range(reps):
        for i in range(n):
            seq = seq_ids[i]
            m = np.int64(lens[seq]) - 1
            slot_out[i] = (np.int64(table[seq, m >> shift]) << shift) | (m & mask)
        # reading a result back each pass keeps the compiler from collapsing identical passes
        acc += slot_out[r % n]
    return acc


def paper_state(trace: Trace | None = None, steps: int = STEPS) -> tuple[FlatBlockManager, np.ndarray]:
    """The flat manager after ``steps`` steps of ``trace`` and the row ids of the next decode step."""
    if trace is None:
        trace = generate(PAPER, steps=steps + 1)
    steps = min(steps, trace.num_steps - 1)
    prep = Prepared.from_trace(trace)
    mgr = FlatBlockManager(**trace.config)
    step_runner(prep, mgr, "batched")(0, steps)
    first, mid, _ = prep.bounds[steps]
    for i in range(first, mid):
        apply_pool_op(mgr, prep.op[i], prep.a0[i], prep.a1[i])
    return mgr, prep.decode_ids[steps].astype(np.int64)


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def _tables(mgr: FlatBlockManager, seq_ids: np.ndarray, num_seqs: int | None) -> Arrays:
    """(table, int32 lengths, row ids) of the paper state, or of it tiled to ``num_seqs`` rows."""
    table = np.ascontiguousarray(mgr.table)
    lens = np.ascontiguousarray(mgr._lens, dtype=np.int32)
    if num_seqs is None:
        return table, lens.copy(), seq_ids
    src = seq_ids[np.arange(num_seqs) % seq_ids.shape[0]]
    return np.ascontiguousarray(table[src]), lens[src].copy(), np.arange(num_seqs, dtype=np.int64)


def _time_call(table: np.ndarray, lens: np.ndarray, ids: np.ndarray, shift: int, reps: int,
               out: np.ndarray) -> int:
    t0 = time.perf_counter_ns()
    _lookup_loop(table, lens, ids, shift, reps, out)
    return time.perf_counter_ns() - t0


def measure(trace: Trace | None = None, steps: int = STEPS, large_seqs: int = LARGE_SEQS, runs: int = RUNS,
            target_ns: int = TARGET_NS) -> dict[str, dict]:
    """Raw measurements per ``<dtype>/<state>``: ns per lookup of every run, reps, sizes, compile seconds."""
    mgr, seq_ids = paper_state(trace, steps)
    if seq_ids.shape[0] == 0:
        raise ValueError(f"no sequence decodes at step {steps}: nothing to look up")
    if mgr.num_blocks > UINT16_LIMIT:
        raise ValueError(f"{mgr.num_blocks} blocks: uint16 ids cannot name them (the paper scenario has 65,536)")
    steps = min(steps, (trace.num_steps - 1) if trace is not None else steps)
    shift = int(mgr.block_shift)
    expected = np.zeros(seq_ids.shape[0], dtype=np.int64)
    mgr.lookup(seq_ids, expected)
    states = {"paper": None, **({"large": large_seqs} if large_seqs else {})}
    out: dict[str, dict] = {}
    for state, num_seqs in states.items():
        base, lens, ids = _tables(mgr, seq_ids, num_seqs)
        slots = np.zeros(ids.shape[0], dtype=np.int64)
        cases = {}
        for dtype in DTYPES:
            name = f"{np.dtype(dtype).name}/{state}"
            table = base.astype(dtype)
            t0 = time.perf_counter()
            _lookup_loop(table, lens, ids, shift, 1, slots)
            compile_s = time.perf_counter() - t0 if state == "paper" else None
            want = expected if num_seqs is None else expected[np.arange(num_seqs) % expected.shape[0]]
            if not np.array_equal(slots, want):
                raise AssertionError(f"{name}: slots differ from the flat design's lookup")
            per_pass = max(1, min(_time_call(table, lens, ids, shift, 1, slots) for _ in range(3)))
            reps = max(1, int(target_ns // per_pass))
            cases[name] = {"table": table, "reps": reps, "ns": [], "compile_s": compile_s, "steps": steps,
                           "seqs": int(ids.shape[0]), "max_blocks_per_seq": int(table.shape[1]),
                           "itemsize": int(table.itemsize), "table_bytes": int(table.nbytes)}
        order = list(cases.values())
        for k in range(runs):
            # in turn, each round starting one width later: no width alone carries each round's cold start
            for case in order[k % len(order):] + order[:k % len(order)]:
                ns = _time_call(case["table"], lens, ids, shift, case["reps"], slots)
                case["ns"].append(ns / (case["reps"] * case["seqs"]))
        for name, case in cases.items():
            del case["table"]
            out[name] = case
    return out


def idwidth_rows(trace: Trace | None = None, scenario: str = PAPER, steps: int = STEPS,
                 large_seqs: int = LARGE_SEQS, runs: int = RUNS) -> list[Row]:
    """The block-id width figures as rows."""
    rows = []
    for regime, case in measure(trace, steps, large_seqs, runs).items():
        state = (f"{case['seqs']} sequences x {case['max_blocks_per_seq']} blocks"
                 + (" (paper state tiled)" if regime.endswith("/large")
                    else f" (paper state after {case['steps']} steps)"))
        how = (f"compiled batched lookup (newest token -> slot) over a {regime.split('/')[0]} flat table of {state}; "
               f"{case['reps']} passes per call, median of {len(case['ns'])} calls taken in turn with the other "
               "widths [bootstrap 95 % interval of the median]")
        median = median_estimate(np.asarray(case["ns"]))
        rows += [
            Row(scenario, IMPL, regime, "idwidth_lookup_ns", median.value, "ns", SOURCE,
                how=how + "; per lookup", reps=len(case["ns"]), seqs=case["seqs"], ci_low=median.low,
                ci_high=median.high),
            Row(scenario, IMPL, regime, "table_bytes_per_seq", case["itemsize"] * case["max_blocks_per_seq"], "B",
                "dtype itemsize", how=f"{case['itemsize']} B x {case['max_blocks_per_seq']} blocks per row"),
            Row(scenario, IMPL, regime, "idwidth_table_bytes", case["table_bytes"], "B", "dtype itemsize",
                how=f"whole table: {state}", seqs=case["seqs"]),
        ]
        if case["compile_s"] is not None:
            rows.append(Row(scenario, IMPL, regime, "idwidth_compile_s", case["compile_s"], "s", "wall clock",
                            how="first call of the lookup loop for this dtype (Numba compile or cache load)"))
    return rows
