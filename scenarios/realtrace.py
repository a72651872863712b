"""Real production traces (and any CSV in their format) replayed through the scheduler.

A CSV needs the columns ``timestamp`` (seconds), ``prompt_tokens`` and ``output_tokens``; other columns are
ignored. Arrivals and lengths come from the file. Time is compressed by Little's law so that the offered load
keeps ``concurrency`` sequences busy: ``concurrency / mean output`` arrivals per decode step. Admission then
follows rows and pool capacity, with recompute preemption, so long prompts (Mooncake's) press the pool. The
run lasts until every request in the window has finished; nothing stays live.

Bundled traces (``scenarios/data``, see ATTRIBUTION.md there): Azure LLM inference 2023 (code) and Mooncake
(conversation, FAST 2025). Mooncake's ``hash_ids`` (prefix sharing between requests) are not modelled yet:
every request gets its own blocks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .scheduler import Request, ScenarioError, Scheduler, TraceBuilder
from .trace import Trace

DATA_DIR = Path(__file__).resolve().parent / "data"
COLUMNS = ("timestamp", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class RealTrace:
    description: str
    defaults: dict


_REAL_DEFAULTS = {
    "num_blocks": 65536,
    "block_size": 16,
    "concurrency": 256,
    "start_s": 0.0,
    "duration_s": None,
    "max_blocks_per_seq": 0,  # 0: just enough for the window's longest request
    "step_rate": 2000,
    "max_steps": 100_000,
    "seed": 0,
}
REAL_TRACES = {
    "azure-code": RealTrace(
        "Azure LLM inference trace 2023, code assistant: 8,819 bursty requests, short outputs",
        {**_REAL_DEFAULTS, "csv": "azure_code_2023.csv"}),
    "mooncake": RealTrace(
        "Mooncake conversation trace (FAST 2025), first 5 minutes: long prompts that press the pool",
        {**_REAL_DEFAULTS, "csv": "mooncake_conversation_2025.csv", "duration_s": 300.0}),
}


def read_requests_csv(path: str | Path) -> pd.DataFrame:
    """Read and check a request CSV; errors name the file line and column at fault."""
    path = Path(path)
    if not path.is_absolute() and not path.exists() and (DATA_DIR / path).exists():
        path = DATA_DIR / path
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such CSV file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: not a readable CSV: {exc}") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ScenarioError(f"{path}: missing column(s) {missing}; a request CSV needs {list(COLUMNS)}")
    out = pd.DataFrame(index=df.index)
    for col in COLUMNS:
        values = pd.to_numeric(df[col].str.strip(), errors="coerce")
        bad = values.isna() | ~np.isfinite(values)
        if col != "timestamp":
            bad |= (values < 1) | (values != np.floor(values))
        else:
            bad |= values < 0
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            need = "a finite number >= 0" if col == "timestamp" else "an integer >= 1"
            raise ScenarioError(f"{path}: line {i + 2}, column {col!r}: {df[col].iloc[i]!r} is not {need}")
        out[col] = values if col == "timestamp" else values.astype(np.int64)
    if out.empty:
        raise ScenarioError(f"{path}: no requests")
    out["line"] = np.arange(len(out)) + 2  # 1-based, after the header line
    return out.sort_values("timestamp", kind="stable").reset_index(drop=True)


class OpenLoop:
    """Requests in arrival order, released to the scheduler when their arrival step comes."""

    def __init__(self, requests: list[Request]) -> None:
        self.queue = deque(requests)

    def __call__(self, step: int, want: int) -> Iterator[Request]:
        while self.queue and self.queue[0].arrival <= step:
            yield self.queue.popleft()


def build_real_trace(name: str, p: dict) -> Trace:
    """Replay a request CSV (``p['csv']``) through the scheduler; see the module docstring."""
    df = read_requests_csv(p["csv"])
    start = p["start_s"]
    end = math.inf if p["duration_s"] is None else start + p["duration_s"]
    window = df[(df.timestamp >= start) & (df.timestamp < end)]
    if window.empty:
        raise ScenarioError(f"{name}: no request arrives in the window [{start}, {end}) s")
    bs = p["block_size"]
    longest = int((window.prompt_tokens + window.output_tokens).max())
    max_blocks = p["max_blocks_per_seq"] or -(-longest // bs)
    too_long = window[window.prompt_tokens + window.output_tokens > max_blocks * bs]
    if len(too_long):
        row = too_long.iloc[0]
        raise ScenarioError(
            f"{name}: line {row.line}: {row.prompt_tokens + row.output_tokens} tokens exceed "
            f"max_blocks_per_seq * block_size = {max_blocks * bs}; raise max_blocks_per_seq"
        )
    if max_blocks > p["num_blocks"]:
        raise ScenarioError(f"{name}: the longest request needs {max_blocks} blocks, the pool has {p['num_blocks']}")

    # Little's law: `concurrency` busy sequences finish concurrency / mean_output requests per step.
    arrivals_per_step = p["concurrency"] / float(window.output_tokens.mean())
    span = max(float(window.timestamp.iloc[-1] - window.timestamp.iloc[0]), 1e-9)
    steps_per_trace_second = len(window) / span / arrivals_per_step
    arrival = np.floor((window.timestamp.to_numpy() - window.timestamp.iloc[0]) * steps_per_trace_second)
    requests = [Request(i, int(pr), int(out), int(at)) for i, (pr, out, at) in
                enumerate(zip(window.prompt_tokens, window.output_tokens, arrival, strict=True))]

    source = OpenLoop(requests)
    config = {"num_blocks": p["num_blocks"], "block_size": bs, "max_seqs": p["concurrency"],
              "max_blocks_per_seq": max_blocks}
    sched = Scheduler(TraceBuilder(config), source, p["concurrency"], preempt=True)
    while source.queue or not sched.idle:
        if sched.step >= p["max_steps"]:
            raise ScenarioError(f"{name}: still running after max_steps={p['max_steps']} steps")
        sched.run_step()
    params = {**p, "max_blocks_per_seq": max_blocks, "requests_in_window": len(window),
              "arrivals_per_step": round(arrivals_per_step, 4),
              "time_compression": round(p["step_rate"] / steps_per_trace_second, 1)}
    return sched.finish(name, params, p["seed"])
