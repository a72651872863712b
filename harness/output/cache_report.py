"""The prefix-caching section of the reports: hit rates, what each design pays for them, each cache operation.
Design: docs/output.md#harnessoutputcache_reportpy."""

from __future__ import annotations

import math

from harness.output.formatting import CACHE_BASE, fmt, ratio_text, value_text
from harness.output.markdown import markdown_table
from harness.output.rundata import RunData, ordered

HIT_METRICS = ("cache_hit_tokens_pct", "cache_hit_blocks_pct", "evictions_per_step")
OPS_COLUMNS = (("cache_hit_ns", "hit ns/block"), ("cache_miss_insert_ns", "miss + insert ns/block"),
               ("cache_miss_evict_ns", "miss + evict ns/block"), ("plain_allocate_ns", "plain allocate ns/block"),
               ("cache_insert_ns", "insert (derived)"), ("cache_evict_ns", "evict (derived)"),
               ("cache_bytes_per_block", "bytes per cached block"))


def caching_scenarios(run: RunData) -> list[str]:
    """Scenarios of the run with prefix-caching figures, in the run's order."""
    df = run.df
    return list(dict.fromkeys(df[df.metric == "cache_hit_tokens_pct"].scenario))


def hit_sentence(run: RunData, scenario: str) -> str:
    """``H % of tokens, E evictions/step`` when every cell agreed, else a warning."""
    df = run.df
    sub = df[(df.scenario == scenario) & df.metric.isin(HIT_METRICS) & (df.status == "ok")]
    values = {m: sorted(set(sub[sub.metric == m].value.round(6))) for m in HIT_METRICS}
    if any(len(v) != 1 for v in values.values()):
        return "**cells disagree**"
    return f"{fmt(values[HIT_METRICS[0]][0])} % of tokens, {fmt(values[HIT_METRICS[2]][0])} evictions/step"


def _hit_line(run: RunData, scenario: str) -> str:
    """One sentence: the scenario's hit rates and evictions, and whether every cell agreed."""
    df = run.df
    sub = df[(df.scenario == scenario) & df.metric.isin(HIT_METRICS) & (df.status == "ok")]
    cells = sub[["impl", "regime"]].drop_duplicates()
    values = {m: sorted(set(sub[sub.metric == m].value.round(6))) for m in HIT_METRICS}
    if any(len(v) != 1 for v in values.values()):
        return (f"**Hit counts differ between cells** ({values}): a correctness failure, see the `correctness` "
                "rows.")
    tokens, blocks, evictions = (values[m][0] for m in HIT_METRICS)
    return (f"Hit rate {fmt(tokens)} % of prompt tokens ({fmt(blocks)} % of full prompt blocks), "
            f"{fmt(evictions)} evictions per step: identical in all {len(cells)} cells (each replay is checked "
            "against the trace's hits step by step; a cell that differs is marked failed and has no figures).")


def _cells_table(run: RunData, scenario: str) -> list[str]:
    """A row per cell the run measured on ``scenario`` (registry order, batched first)."""
    header = ["impl", "regime", "ns/seq-step", "× flat-pc", "CPU share % (computed)", "alloc/free ns", "allocs/step"]
    return markdown_table(header, [
        [f"`{impl}`", regime, value_text(run, scenario, impl, regime, "seq_step_ns"),
         ratio_text(run, scenario, impl, regime, "seq_step_ns", base=CACHE_BASE),
         *(value_text(run, scenario, impl, regime, m) for m in ("cpu_share_pct", "alloc_free_ns", "allocs_per_step"))]
        for impl, regime in run.cells(scenario)])


def _ops_table(run: RunData) -> list[str]:
    df = run.df
    sub = df[df.metric == "cache_hit_ns"]
    if sub.empty:
        return []
    scenario = sub.scenario.iloc[0]
    out = [f"Cache operations one at a time (`kvblock-bench` study `cache_ops`, on `{scenario}`'s block size; "
           "admissions of a 32-block chain, median of timed admissions with its 95 % interval; derived columns are "
           "differences of medians):", ""]
    rows = []
    for impl in ordered(sub.impl):
        vals = []
        for metric, _ in OPS_COLUMNS:
            v = run.value(scenario, impl, "per-call", metric)
            vals.append("—" if math.isnan(v) else value_text(run, scenario, impl, "per-call", metric))
        rows.append([f"`{impl}`", *vals])
    return [*out, *markdown_table(["impl", *(h for _, h in OPS_COLUMNS)], rows)]


def _hashing_table(run: RunData, scenarios: list[str]) -> list[str]:
    """Block hashing per algorithm: ns per block, and per sequence-step of each caching scenario."""
    df = run.df
    sub = df[(df.regime == "hash") & (df.metric == "hash_ns_per_block")]
    if sub.empty:
        return []
    first = sub.scenario.iloc[0]
    out = ["Block hashing, which engines do on token ids and our traces carry precomputed "
           "(`harness/studies/block_hashing.py`: each engine's documented algorithm; median of interleaved loops over "
           "chained 16-token blocks, [lowest–highest loop]):", ""]
    rows = []
    for algo in dict.fromkeys(sub[sub.scenario == first].impl):
        row = run.get(first, algo, "hash", "hash_ns_per_block")
        if row is None or row["status"] != "ok":
            rows.append([f"`{algo}`", f"{row['status'] if row else '—'}: {row['how'] if row else ''}",
                         *("" for _ in scenarios)])
            continue
        rows.append([f"`{algo}`", value_text(run, first, algo, "hash", "hash_ns_per_block"),
                     *(value_text(run, s, algo, "hash", "hash_ns_per_seq_step") for s in scenarios)])
    return [*out, *markdown_table(["algorithm", "ns per block", *(f"ns per seq-step, `{s}`" for s in scenarios)],
                                  rows)]


def prefix_cache_section(run: RunData, heading: str = "#") -> str:
    """The prefix-caching section, or "" when the run measured no caching scenario."""
    scenarios = caching_scenarios(run)
    if not scenarios:
        return ""
    out = [f"{heading} Prefix caching", "",
           "Designs with a prefix cache (hash -> block, evictable blocks in least-recently-freed order; the contract "
           "is `impls/contract.py`, `CachingBlockManager`) replaying traces whose requests share prefixes. "
           "Brackets: 95 % intervals; × flat-pc: paired ratio to batched or per-call `flat-pc` in the same run.", ""]
    for scenario in scenarios:
        out += [f"{heading}# `{scenario}`", "", _hit_line(run, scenario), "", *_cells_table(run, scenario), ""]
    for table in (_ops_table(run), _hashing_table(run, scenarios)):
        if table:
            out += [*table, ""]
    return "\n".join(out) + "\n"
