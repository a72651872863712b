"""Measuring the rule-3 variants on a trace, and turning the samples into rows."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.base.files import new_run_dir, write_json
from harness.base.interrupts import signal_name
from harness.base.replay import ReplayError, apply_pool_op
from harness.base.rows import Row, write_rows
from harness.errors import InputError
from harness.studies.table_copy.copied import Copied
from harness.studies.table_copy.variants import (
    COMPUTED,
    COPY_METRICS,
    CUDA_EVENTS,
    DEFAULT_SCENARIOS,
    DEFAULT_WARMUP,
    HOST_CPU,
    HOST_CUDA,
    IMPL,
    MAX_STEPS,
    MIN_STEPS,
    NEEDS_TORCH,
    NO_CUDA,
    SEQ_STEPS,
    TABLE_ENTRIES,
    UNITS,
    VARIANTS,
    WIDEN,
    Marker,
    Samples,
    StepState,
    TableCopyBench,
    gather_tables,
    step_state,
)
from scenarios.trace import ALLOCATE, FORK, Trace


def _matches(copied: Copied, st: StepState, want: np.ndarray) -> bool:
    """Whether the variant's device table holds exactly ``want``, the host's tables of the live rows."""
    return bool(np.array_equal(gather_tables(copied.out.cpu().numpy(), copied.layout, st.ids, st.nblocks), want))


def _pool_ops(mgr, trace: Trace, s: int, pool_rows: list[int]) -> None:
    """Apply step ``s``'s pool operations; rows allocated or forked are appended to ``pool_rows``."""
    lo, mid = int(trace.step_offsets[s]), int(trace.decode_offsets[s])
    for o, x, y in zip(trace.op[lo:mid].tolist(), trace.a0[lo:mid].tolist(), trace.a1[lo:mid].tolist(), strict=True):
        apply_pool_op(mgr, o, x, y)
        if o == ALLOCATE:
            pool_rows.append(x)
        elif o == FORK:
            pool_rows.append(y)


def _time_tasks(bench: TableCopyBench, tasks: dict, order: list[str], st: StepState, samples: Samples,
                events: dict) -> dict[str, tuple[int, Copied | None]]:
    """Run each task of ``order`` on the step; host ns (event recording excluded) and what each copied."""
    perf = time.perf_counter_ns
    results: dict[str, tuple[int, Copied | None]] = {}
    for name in order:
        if name in samples.failed:
            continue
        ev = events.get(name)
        mark = Marker(perf, ev[0] if ev else None)
        try:
            t0 = perf()
            copied = tasks[name](st, mark)
            t1 = perf()
        except (RuntimeError, TypeError, ValueError) as exc:
            samples.failed[name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if ev:
            ev[1].record()
        results[name] = (t1 - t0 - mark.excluded, copied)
    if bench.cuda:
        bench.torch.cuda.synchronize()
    return results


def _record(bench: TableCopyBench, st: StepState, results: dict, events: dict, samples: Samples) -> None:
    """Check each variant's device table against the host's and keep its samples."""
    want = gather_tables(bench.table, "rows", st.ids, st.nblocks)
    for name, (ns, copied) in results.items():
        key = name.removeprefix("widen:")
        if name.startswith("widen:"):
            samples.add(f"{key}/table_widen_ns", ev_ns(events[name]) if key == "device" else ns)
            continue
        if not _matches(copied, st, want):
            samples.mismatches[name] = samples.mismatches.get(name, 0) + 1
        samples.add(f"{key}/table_copy_ns", ns)
        samples.add(f"{key}/table_copy_ns_per_seq", ns / st.ids.size)
        samples.add(f"{key}/table_copy_bytes", copied.nbytes)
        samples.add(f"{key}/table_copy_bytes_per_step", copied.nbytes)
        samples.add(f"{key}/table_copies", copied.copies)
        if bench.cuda and copied.copies:
            samples.add(f"{key}/table_copy_device_ns", ev_ns(events[name]))


def _run_window(bench: TableCopyBench, trace: Trace, start: int, end: int, samples: Samples) -> None:
    """Replay steps ``0..end-1``, timing every task in ``start..end-1`` (after an untimed warm-up)."""
    torch, mgr = bench.torch, bench.mgr
    tasks = bench.tasks()
    names = list(tasks)
    n_max = max(1, int(trace.running_per_step().max(initial=0)))
    cow_out, slot_out = np.zeros((n_max, 2), np.int64), np.zeros(n_max, np.int64)
    seq_ids = trace.a0.astype(np.int64)
    events = {k: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for k in names} \
        if bench.cuda else {}
    pool_rows: list[int] = []
    for s in range(end):
        bench.table_guard.before_write()
        if s == start:
            bench.sync_mirror()
            pool_rows = []
        _pool_ops(mgr, trace, s, pool_rows)
        ids = seq_ids[int(trace.decode_offsets[s]) : int(trace.step_offsets[s + 1])]
        cows = mgr.decode_step(ids, cow_out, slot_out)
        if cows != trace.step_cows[s]:
            raise ReplayError(f"step {s}: {cows} copy-on-writes, the trace expects {trace.step_cows[s]}")
        if s < start - 1 or ids.size == 0:
            continue
        st = step_state(mgr, ids, slot_out[: ids.size].copy(), cow_out[:cows, 1].copy(), pool_rows)
        pool_rows = []
        order = names[s % len(names):] + names[: s % len(names)]
        results = _time_tasks(bench, tasks, order, st, samples, events)
        if s < start:
            continue
        samples.add("steps", s)
        samples.add("live", ids.size)
        _record(bench, st, results, events, samples)
    bench.table_guard.before_write()


def ev_ns(pair: tuple[Any, Any]) -> float:
    """Nanoseconds between a pair of completed CUDA events."""
    return pair[0].elapsed_time(pair[1]) * 1e6


def default_steps(trace: Trace) -> int:
    """Steps to time by default: fixed budgets of sequence-steps and of table entries, at least :data:`MIN_STEPS`."""
    batch = max(1, int(trace.running_per_step().max(initial=0)))
    entries = max(1, trace.config["max_seqs"] * trace.config["max_blocks_per_seq"])
    return max(MIN_STEPS, min(MAX_STEPS, SEQ_STEPS // batch, TABLE_ENTRIES // entries))


def _window(trace: Trace, steps: int, warmup: int) -> tuple[int, int]:
    """Steps ``start..end-1`` to time."""
    start = min(warmup, trace.num_steps // 2)
    return start, min(trace.num_steps, start + steps)


MEAN_METRICS = ("table_copy_bytes_per_step",)


def _row(scenario: str, regime: str, metric: str, values: list[float] | None, source: str, how: str,
         status: str = "ok") -> Row:
    if status == "ok" and not values:
        status, how = "skipped", "no step in the window gave a sample"
    mean = metric in MEAN_METRICS
    if status == "ok" and mean:
        how = how.replace("median of", "mean over")
    value = (statistics.fmean(values) if mean else statistics.median(values)) if status == "ok" else float("nan")
    return Row(scenario, IMPL, regime, metric, value, UNITS[metric], source, status, how)


def _unavailable_rows(scenario: str, why: str) -> list[Row]:
    rows = [Row(scenario, IMPL, v, m, float("nan"), UNITS[m], "", "unavailable", why)
            for v in VARIANTS for m in COPY_METRICS]
    rows += [Row(scenario, IMPL, w, "table_widen_ns", float("nan"), "ns", "", "unavailable", why) for w in WIDEN]
    return rows


def _rows(scenario: str, samples: Samples, cuda: bool, window: tuple[int, int], widens: bool,
          no_device: str) -> list[Row]:
    values = samples.values
    where = f"median of {len(values.get('steps', []))} decode steps ({window[0]}..{window[1] - 1})"
    host_src = HOST_CUDA if cuda else HOST_CPU
    rows = []
    for v in VARIANTS:
        failed = samples.failed.get(v)
        if samples.mismatches.get(v):
            failed = f"device table differed from the host tables at {samples.mismatches[v]} steps"
        for metric in COPY_METRICS:
            source = {"table_copy_device_ns": CUDA_EVENTS, "table_copy_bytes": COMPUTED,
                      "table_copy_bytes_per_step": COMPUTED, "table_copies": COMPUTED}.get(metric, host_src)
            if failed:
                rows.append(_row(scenario, v, metric, None, source, failed, "failed"))
            elif metric == "table_copy_device_ns" and not cuda:
                rows.append(_row(scenario, v, metric, None, "", no_device, "unavailable"))
            else:
                rows.append(_row(scenario, v, metric, values.get(f"{v}/{metric}"), source, where))
    for w in WIDEN:
        source = CUDA_EVENTS if w == "device" else "perf_counter_ns, host"
        if not widens:
            rows.append(_row(scenario, w, "table_widen_ns", None, "", "table ids are 32-bit already", "skipped"))
        elif f"widen:{w}" in samples.failed:
            rows.append(_row(scenario, w, "table_widen_ns", None, source, samples.failed[f"widen:{w}"], "failed"))
        elif w == "device" and not cuda:
            rows.append(_row(scenario, w, "table_widen_ns", None, "", no_device, "unavailable"))
        else:
            rows.append(_row(scenario, w, "table_widen_ns", values.get(f"{w}/table_widen_ns"), source,
                             f"{where}; live rows, all columns"))
    return rows


def measure(trace: Trace, steps: int | None = None, warmup: int = DEFAULT_WARMUP,
            device: str = "auto") -> tuple[list[Row], dict[str, list[float]]]:
    """Measure every variant on ``trace`` (the flat design); returns the tidy rows and the raw per-step samples."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    steps = default_steps(trace) if steps is None else steps
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got {steps} and {warmup}")
    scenario = str(trace.header["scenario"])
    try:
        import torch
    except ImportError:
        if device == "cuda":
            raise RuntimeError(f"device='cuda' {NEEDS_TORCH}") from None
        return _unavailable_rows(scenario, NEEDS_TORCH), {}
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but torch.cuda.is_available() is False")
    bench = TableCopyBench(torch, trace.config, cuda)
    window = _window(trace, steps, warmup)
    samples = Samples()
    threads = torch.get_num_threads()
    # One intra-op thread: the CPU copy stands in for a DMA engine, not for host threads.
    torch.set_num_threads(1)
    try:
        _run_window(bench, trace, *window, samples)
    finally:
        torch.set_num_threads(threads)
    no_device = NO_CUDA if not torch.cuda.is_available() else "device='cpu' requested"
    return _rows(scenario, samples, cuda, window, bench.widens, no_device), samples.values


FLAG_STEPS = 10_000  # the most steps --steps and --warmup may each ask for


def _print_table(rows: Sequence[Row]) -> None:
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    cells = {(r.scenario, r.regime, r.metric): r for r in rows}
    keys = [(v, m) for v in VARIANTS for m in ("table_copy_ns", "table_copy_device_ns", "table_copy_bytes")]
    keys += [(w, "table_widen_ns") for w in WIDEN]

    def show(r: Row | None) -> str:
        if r is None:
            return "-"
        return f"{r.value:,.0f}" if r.status == "ok" else r.status

    print(f"{'regime':<16}{'metric':<22}" + "".join(f"{s:>18}" for s in scenarios))
    for regime, metric in keys:
        print(f"{regime:<16}{metric:<22}" + "".join(f"{show(cells.get((s, regime, metric))):>18}"
                                                   for s in scenarios))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kvblock-bench table-copy``'s options."""
    parser.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS), metavar="NAME")
    from harness.base.args import count

    parser.add_argument("--steps", type=count(1, FLAG_STEPS), help=f"decode steps timed per scenario (default: "
                        f"{SEQ_STEPS:,} sequence-steps, {MIN_STEPS} to {MAX_STEPS} steps; at most {FLAG_STEPS:,})")
    parser.add_argument("--warmup", type=count(0, FLAG_STEPS), default=DEFAULT_WARMUP,
                        help=f"untimed steps before them (default {DEFAULT_WARMUP}, at most {FLAG_STEPS:,})")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--out", type=Path, help="run directory to write (default: a new results/<id>-table-copy)")
    parser.add_argument("--full-trace", action="store_true",
                        help="generate every scenario's full trace (default: only its first warmup+steps steps, "
                             "which are identical, and faster to generate)")


def _device_meta() -> dict[str, object]:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    return {"torch": torch.__version__,
            "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def run(args: argparse.Namespace) -> int:
    """Measure, write ``results.csv`` and raw samples into a run folder, print a table."""
    from scenarios import SCENARIOS, generate

    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        raise InputError(f"--scenarios: unknown scenario(s) {', '.join(unknown)}; see `kvblock-bench scenarios`")
    if (args.steps is not None and args.steps < 1) or args.warmup < 0:
        raise InputError("--steps must be >= 1 and --warmup >= 0")
    made = args.out is None or not args.out.exists()
    out = args.out or new_run_dir(label="table-copy")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    timings: dict[str, float] = {}
    meta = {"command": ["kvblock-bench", *sys.argv[1:]], "seconds_per_scenario": timings}
    try:
        for name in args.scenarios:
            overrides = {} if args.full_trace else {"steps": args.warmup + (args.steps or MAX_STEPS)}
            trace = generate(name, **overrides)
            t0 = time.perf_counter()
            got, raw = measure(trace, args.steps, args.warmup, args.device)
            timings[name] = round(time.perf_counter() - t0, 3)
            rows += got
            write_rows(out / "results.csv", rows)
            write_json(out / "raw" / name / f"{IMPL}__table-copy.json.gz", raw, compress=True)
            print(f"{name}: measured in {timings[name]:.1f} s", file=sys.stderr)
    except KeyboardInterrupt as exc:  # what finished is kept and said so; a folder made for nothing goes
        if rows:
            write_json(out / "table_copy_meta.json", {**meta, "interrupted_by": signal_name(exc)})
        elif made:
            shutil.rmtree(out, ignore_errors=True)
        raise
    write_json(out / "table_copy_meta.json", {**meta, **_device_meta()})
    _print_table(rows)
    print(f"\nwrote {out / 'results.csv'}")
    return 1 if any(r.status == "failed" for r in rows) else 0
