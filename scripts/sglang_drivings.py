"""Why two drivings of SGLang's allocator disagreed (issue 50, item 5): each driving measured side by side on `paper`.

Usage: python scripts/sglang_drivings.py [--reps 5] [--before REV] [--steps N] [--out FILE] [--cache DIR]

An independent driver that times SGLang 0.5.23's ``PagedTokenToKVPoolAllocator`` calls alone read it at about 700
ns per sequence-step and the ``sglang`` contender at 1,000-1,100 beside it (1.45-1.77), while ``kvblock-bench
calibrate`` read 1.08. This script measures every piece of that difference in one process, each repetition running
every variant once (rotated order), on the same trace:

- ``allocator``: the allocator's calls alone, driven as SGLang's scheduler drives them (a step's frees in one free
  group, one ``alloc_decode`` for the decode batch) with the step's admissions extended either one
  ``alloc_extend`` per admission or one per prefill batch; SGLang's allocator and our model of it
  (``impls.contenders.sglang.PagedAllocator``). The rows, lengths and index tensors around the calls are built
  outside the timed calls, as that driver did.
- ``step``: what ``calibrate`` times, the whole decode step and pool operations through the harness's batched
  Python driver, with the allocator's calls metered apart after the timed replays: the contender before the
  prefill batch (``--before``, one ``alloc_extend`` per admission) and now, and SGLang's allocator behind the
  calibration's adapter as it was driven before (per admission, without the contract's checks) and now (one
  prefill batch, the contenders' checks).

A step its thread was preempted in (its CPU clock behind the wall clock, ``harness.base.oncpu``) leaves that
repetition's figure, as in every run: each step's time is its median over the repetitions that ran it whole
(``ran_whole``), a repetition's figure fills its preempted steps with that median. Writes ``--out`` (default
``results/calibration/sglang-drivings.csv``, atomically): per variant, ns per sequence-step (the sum of the steps'
medians, and the repetitions' min-max) and the allocator's calls metered apart (as ``calibrate`` meters them, the
median of three replays); per pair of variants, the ratio of their figures with its min-max over the repetitions
(paired within each); the load average, machine and command.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shlex
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.base.drivers import Prepared, run_interpreted  # noqa: E402
from harness.base.files import atomic_write_text  # noqa: E402
from harness.base.metrics import Work  # noqa: E402
from harness.base.oncpu import ran_share, ran_whole, thread_ns  # noqa: E402
from harness.base.threads import one_intra_op_thread  # noqa: E402
from harness.calibration.run import machine  # noqa: E402
from harness.engines import fetch, sglang_engine  # noqa: E402
from harness.engines.call_meter import MeteredReplays, meter_cost, metered_replay  # noqa: E402
from harness.engines.loader import engine_imports  # noqa: E402
from impls.core.validation import batch_args  # noqa: E402
from scenarios import generate  # noqa: E402
from scenarios.trace import ALLOCATE, FREE  # noqa: E402

VERSION = "0.5.23"
BEFORE = "bb42019"  # the commit before "one prefill batch per step" (SGLang's alloc_for_extend)
OUT = ROOT / "results" / "calibration" / "sglang-drivings.csv"
COLUMNS = ("part", "variant", "ns_per_seq_step", "low", "high", "vs", "ratio", "ratio_low", "ratio_high",
           "engine_calls_ns", "reps", "seq_steps", "load", "machine", "made", "command")


def module_at(rev: str, path: str, name: str) -> types.ModuleType:
    """``path`` as it was at commit ``rev``, imported as module ``name`` (nothing written to disk)."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout
    module = types.ModuleType(name)
    module.__file__ = f"{rev}:{path}"
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # our own file, as it was at that commit
    return module


# -- the allocator's calls alone -------------------------------------------------------------------------------
class Scheduler:
    """The scheduler's state around an allocator (rows, lengths), kept outside the timed calls."""

    def __init__(self, torch, allocator, prep: Prepared, per_admission: bool) -> None:
        cfg = prep.trace.config
        self.torch, self.alloc, self.prep, self.per_admission = torch, allocator, prep, per_admission
        self.rows = torch.zeros((cfg["max_seqs"], cfg["max_blocks_per_seq"] * cfg["block_size"]), dtype=torch.int32)
        self.lens = [0] * cfg["max_seqs"]

    def step(self, s: int) -> float:
        """Step ``s``'s allocator calls; the nanoseconds they took."""
        first, mid, _ = self.prep.bounds[s]
        ops = [(self.prep.op[i], self.prep.a0[i], self.prep.a1[i]) for i in range(first, mid)]
        ns = self.frees([r for o, r, _ in ops if o == FREE])
        admitted = [(r, n) for o, r, n in ops if o == ALLOCATE]
        for batch in ([[a] for a in admitted] if self.per_admission else [admitted] if admitted else []):
            ns += self.extend(batch)
        return ns + self.decode(self.prep.decode_ids[s].tolist())

    def frees(self, rows: list[int]) -> float:
        if not rows:
            return 0.0
        slots = [self.rows[r, : self.lens[r]] for r in rows]
        for r in rows:
            self.lens[r] = 0
        t0 = time.perf_counter_ns()
        self.alloc.free_group_begin()
        for index in slots:
            self.alloc.free(index)
        self.alloc.free_group_end()
        return time.perf_counter_ns() - t0

    def extend(self, batch: list[tuple[int, int]]) -> float:
        torch = self.torch
        lens = torch.tensor([n for _, n in batch], dtype=torch.int64)
        prefix = torch.zeros(len(batch), dtype=torch.int64)
        last = torch.full_like(prefix, -1)
        total = int(lens.sum())
        t0 = time.perf_counter_ns()
        out = self.alloc.alloc_extend(prefix, prefix, lens, lens, last, total)
        ns = time.perf_counter_ns() - t0
        at = 0
        for row, n in batch:
            self.rows[row, :n] = out[at: at + n].to(torch.int32)
            self.lens[row] = n
            at += n
        return ns

    def decode(self, ids: list[int]) -> float:
        torch = self.torch
        rows = torch.tensor(ids, dtype=torch.int64)
        lens = torch.tensor([self.lens[r] for r in ids], dtype=torch.int64)
        last = self.rows[rows, lens - 1].to(torch.int64)
        nxt = lens + 1
        t0 = time.perf_counter_ns()
        out = self.alloc.alloc_decode(nxt, nxt, last)
        ns = time.perf_counter_ns() - t0
        self.rows[rows, lens] = out.to(torch.int32)
        for r in ids:
            self.lens[r] += 1
        return ns


Samples = tuple[np.ndarray, np.ndarray, np.ndarray]  # per step: timed ns, its wall span, the share run on CPU


def allocator_replay(make: Callable[[], object], per_admission: bool, torch, prep: Prepared) -> Samples:
    """Per step, the allocator calls' ns of one replay, the step's wall span and its on-CPU share."""
    sched = Scheduler(torch, make(), prep, per_admission)
    out, span, ran = (np.zeros(prep.num_steps) for _ in range(3))
    for s in range(prep.num_steps):
        w0, c0 = time.perf_counter_ns(), thread_ns()
        out[s] = sched.step(s)
        span[s] = time.perf_counter_ns() - w0
        ran[s] = ran_share(span[s], thread_ns() - c0)
    return out, span, ran


# -- the calibrated step -----------------------------------------------------------------------------------------
def step_replay(cls: type, prep: Prepared) -> Samples:
    """Per step, the whole timed step's ns of one batched replay through the harness's driver, span and share."""
    mgr = cls(**prep.trace.config)
    times = run_interpreted(prep, mgr, "batched")
    times.check(prep.trace.step_cows, prep.slot_digests)
    return times.step_ns, times.span_ns, times.ran


def engine_calls(cls: type, prep: Prepared, cost: tuple[float, float], replays: int = 3) -> float:
    """The allocator's calls (the replay's ``allocator`` object metered, as ``calibrate`` meters it), ns per
    sequence-step: the median of ``replays`` full replays, each on a fresh manager."""
    work = Work.of(prep).seq_steps_per_step
    m = MeteredReplays("allocator", int(work.sum()), *cost)
    for _ in range(replays):
        mgr = cls(**prep.trace.config)
        metered_replay(m, mgr.allocator, lambda s, mgr=mgr: run_interpreted(prep, mgr, "batched", s, s + 1), work)
    return m.engine().value


def before_adapter(engine_cls: type, old: types.ModuleType) -> type:
    """The calibration's SGLang adapter as it was before: the old rows (an ``alloc_extend`` per admission), no
    contract checks in its decode step, and the per-row lookup of :class:`InterpretedBlockManager`."""
    from impls.core.interpreted import InterpretedBlockManager

    methods = {k: v for k, v in vars(old.PagedRows).items() if callable(v)}
    methods["lookup"] = InterpretedBlockManager.lookup

    def decode_step(self, seq_ids, cow_out, slot_out):
        return self._engine_step(seq_ids, batch_args(seq_ids, cow_out, slot_out, self.max_seqs).tolist(), cow_out,
                                 slot_out)

    return type("SGLangEngineBefore", (engine_cls,), {**methods, "_engine_step": old.PagedRows._decode,
                                                      "decode_step": decode_step})


def variants(sglang: types.SimpleNamespace, old: types.ModuleType, torch, prep: Prepared) -> dict[str, tuple]:
    """Name -> (part, replay function, class metered for its engine calls or None)."""
    from impls.contenders.sglang import PagedAllocator, SGLangBlockManager

    cfg = prep.trace.config
    size, ps = cfg["num_blocks"] * cfg["block_size"], cfg["block_size"]

    def real():
        return sglang.PagedTokenToKVPoolAllocator(size=size, page_size=ps, dtype=torch.float16, device="cpu",
                                                  kvcache=None, need_sort=False)

    def model():
        return PagedAllocator(size, ps)

    engine = sglang_engine.baselines(sglang, VERSION)[0].cls
    out = {}
    for name, make in (("SGLang's allocator", real), ("our model of it", model)):
        for per, label in ((True, "per admission"), (False, "per prefill batch")):
            out[f"{name}, {label}"] = ("allocator", lambda m=make, p=per: allocator_replay(m, p, torch, prep), None)
    for name, cls in (("sglang contender before", old.SGLangBlockManager), ("sglang contender now", SGLangBlockManager),
                      ("SGLang behind the adapter before", before_adapter(engine, old)),
                      ("SGLang behind the adapter now", engine)):
        out[name] = ("step", lambda c=cls: step_replay(c, prep), cls)
    return out


PAIRS = (  # (variant, the variant it is paired against): each a row of its own
    ("SGLang's allocator, per admission", "SGLang's allocator, per prefill batch"),
    ("our model of it, per admission", "SGLang's allocator, per admission"),
    ("our model of it, per prefill batch", "SGLang's allocator, per prefill batch"),
    ("sglang contender before", "SGLang's allocator, per prefill batch"),  # the independent driver's ratio
    ("sglang contender now", "SGLang's allocator, per prefill batch"),
    ("sglang contender before", "SGLang behind the adapter before"),  # calibrate's ratio before
    ("sglang contender now", "SGLang behind the adapter now"),  # calibrate's ratio now
    ("SGLang behind the adapter now", "SGLang's allocator, per prefill batch"),  # the shared work's share
)


def measure(reps: int, found: dict[str, tuple], seq_steps: int) -> dict[str, tuple[float, list[float]]]:
    """Per variant: ns per sequence-step (the sum of each step's median over the repetitions that ran it whole) and
    each repetition's figure (its preempted steps at that median)."""
    names = list(found)
    samples: dict[str, list[Samples]] = {n: [] for n in names}
    for rep in range(reps):
        for n in names[rep % len(names):] + names[: rep % len(names)]:
            samples[n].append(found[n][1]())
        print(f"repetition {rep + 1} of {reps} done", file=sys.stderr)
    out = {}
    for n, got in samples.items():
        values, span, ran = (np.array([g[i] for g in got]) for i in range(3))
        whole = ran_whole(values, span, ran)
        median = np.nanmedian(whole, axis=0)
        per_rep = np.where(np.isnan(whole), median, whole).sum(axis=1) / seq_steps
        out[n] = (float(median.sum() / seq_steps), per_rep.tolist())
        print(f"{n}: {np.isnan(whole).mean():.1%} of its steps preempted", file=sys.stderr)
    return out


def rows(figures: dict[str, tuple[float, list[float]]], calls: dict[str, float], found: dict[str, tuple],
         seq_steps: int, load: str, command: str) -> list[dict[str, str]]:
    """A row per variant, then a row per pair of :data:`PAIRS` (its ratio paired within each repetition)."""
    made, where = time.strftime("%Y-%m-%dT%H:%M:%S%z"), machine()
    common = {"reps": "", "seq_steps": str(seq_steps), "load": load, "machine": where, "made": made,
              "command": command}
    out = []
    for name, (value, values) in figures.items():
        v = np.array(values)
        out.append({**common, "part": found[name][0], "variant": name, "ns_per_seq_step": f"{value:.0f}",
                    "low": f"{v.min():.0f}", "high": f"{v.max():.0f}", "vs": "", "ratio": "", "ratio_low": "",
                    "ratio_high": "", "engine_calls_ns": f"{calls[name]:.0f}" if name in calls else "",
                    "reps": str(len(v))})
    for name, vs in PAIRS:
        r = np.array(figures[name][1]) / np.array(figures[vs][1])
        out.append({**common, "part": "ratio", "variant": name, "ns_per_seq_step": "", "low": "", "high": "",
                    "vs": vs, "ratio": f"{figures[name][0] / figures[vs][0]:.3f}", "ratio_low": f"{r.min():.3f}",
                    "ratio_high": f"{r.max():.3f}", "engine_calls_ns": "", "reps": str(len(r))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--before", default=BEFORE, help="the commit whose sglang contender extends per admission")
    ap.add_argument("--steps", type=int, default=None, help="paper's steps (default: the scenario's)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--cache", type=Path, default=None, help="the engines' cache (default: kvblock-bench's)")
    args = ap.parse_args(argv)
    command = shlex.join(["python", "scripts/sglang_drivings.py", *(sys.argv[1:] if argv is None else argv)])
    code = fetch.published("sglang", VERSION, ("sglang",), args.cache or fetch.default_cache(), None)
    old = module_at(args.before, "impls/contenders/sglang.py", "sglang_contender_before")
    trace = generate("paper", **({"steps": args.steps} if args.steps else {}))
    prep = Prepared.from_trace(trace)
    seq_steps = int(trace.running_per_step().sum())
    load = [os.getloadavg()[0]]
    with engine_imports(sglang_engine.plan(VERSION), code.root), one_intra_op_thread():
        import torch

        found = variants(sglang_engine.load(VERSION), old, torch, prep)
        figures = measure(args.reps, found, seq_steps)
        cost = meter_cost()
        calls = {n: engine_calls(v[2], prep, cost) for n, v in found.items() if v[2] is not None}
    load.append(os.getloadavg()[0])
    table = rows(figures, calls, found, seq_steps, "-".join(f"{x:.2f}" for x in load), command)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    atomic_write_text(args.out, buf.getvalue())
    for r in table:
        if r["vs"]:
            print(f"{r['variant']} / {r['vs']}: {r['ratio']} [{r['ratio_low']}-{r['ratio_high']}]")
        else:
            calls_text = f"  (allocator calls {r['engine_calls_ns']})" if r["engine_calls_ns"] else ""
            print(f"{r['part']:<9} {r['variant']:<36} {r['ns_per_seq_step']:>6} [{r['low']}-{r['high']}]"
                  f"{calls_text}")
    print(f"written to {args.out} (load average {table[0]['load']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
