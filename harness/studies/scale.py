"""What the scale sweeps sweep, as rows: each scenario's configuration, read from its trace."""

from __future__ import annotations

from harness.base.rows import Row
from scenarios.trace import Trace

CONFIG = {
    "trace_max_tokens": ("tokens", "the most tokens a sequence may hold (max_blocks_per_seq x block_size)"),
    "trace_num_blocks": ("blocks", "blocks in the pool"),
    "trace_running": ("seqs", "the most sequences running in one decode step"),
    "trace_peak_blocks": ("blocks", "the most blocks in use after any step"),
}
CONFIG_METRICS = tuple(CONFIG)
FAMILY_AXES = {"context": "trace_max_tokens", "pool": "trace_num_blocks", "concurrency": "trace_running"}


def config_rows(name: str, trace: Trace) -> list[Row]:
    """The trace's configuration as rows of scenario ``name`` (source: the trace header)."""
    cfg = trace.config
    values = {"trace_max_tokens": cfg["max_blocks_per_seq"] * cfg["block_size"],
              "trace_num_blocks": cfg["num_blocks"],
              "trace_running": int(trace.running_per_step().max(initial=0)),
              "trace_peak_blocks": int(trace.header["peak_blocks_in_use"])}
    return [Row(name, "-", "-", metric, float(values[metric]), unit, "trace header", how=how, steps=trace.num_steps)
            for metric, (unit, how) in CONFIG.items()]
