"""Trace validation: the header's schema and the arrays' structure, checksum, caching and end state."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from impls.contract import (
    ALLOCATE,
    ALLOCATE_CACHED,
    APPEND,
    CAN_ALLOCATE,
    FORK,
    OP_NAMES,
    SEAL,
    blocks_for,
    check_config,
)

from . import ARRAYS, Trace, TraceError
from .file_format import (
    CACHE_KEYS,
    CONFIG_KEYS,
    COUNT_FIELDS,
    HEADER_KEYS,
    MAX_POOL_BLOCKS,
    MAX_TABLE_ENTRIES,
    MAX_TRACE_BYTES,
    REGENERATE,
    checksum,
)


def _require(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise TraceError(f"header field {field!r} {what}; {REGENERATE}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate_header(h: Mapping) -> None:
    """Schema of a header: fields, types, ranges and the configuration contract; raises :class:`TraceError`."""
    if not isinstance(h, Mapping):
        raise TraceError(f"header is a {type(h).__name__}, not a JSON object; {REGENERATE}")
    missing, unknown = sorted(HEADER_KEYS - set(h)), sorted(set(h) - HEADER_KEYS)
    if missing:
        raise TraceError(f"header lacks {missing}; {REGENERATE}")
    if unknown:
        raise TraceError(f"header has unknown fields {unknown}; {REGENERATE}")
    for key in ("scenario", "checksum"):
        _require(isinstance(h[key], str), key, f"must be a string, got {h[key]!r}")
    _require(re.fullmatch(r"[0-9a-f]{64}", h["checksum"]) is not None, "checksum", "must be 64 hex digits")
    for key in ("params", "config", "ops_by_kind"):
        _require(isinstance(h[key], dict), key, f"must be a JSON object, got {type(h[key]).__name__}")
    for key in COUNT_FIELDS:
        _require(_is_count(h[key]), key, f"must be an integer >= 0, got {h[key]!r}")
    _require(h["num_steps"] >= 1, "num_steps", "must be at least 1")
    _validate_config(h["config"])
    _validate_cache_header(h)
    _validate_counts(h)


def _validate_cache_header(h: Mapping) -> None:
    _require(isinstance(h["prefix_caching"], bool), "prefix_caching",
             f"must be true or false, got {h['prefix_caching']!r}")
    c = h["cache"]
    _require(isinstance(c, dict) and sorted(c) == sorted(CACHE_KEYS) and all(map(_is_count, c.values())), "cache",
             f"must give a count >= 0 for each of {sorted(CACHE_KEYS)}")
    _require(c["hit_tokens"] == c["hit_blocks"] * h["config"]["block_size"], "cache.hit_tokens",
             "must be cache.hit_blocks * block_size")
    _require(c["hit_blocks"] <= c["lookup_blocks"] and c["hit_tokens"] <= c["lookup_tokens"], "cache.hit_blocks",
             "must not exceed what was looked up")
    _require(c["seals_cached"] <= c["seals"], "cache.seals_cached", "must not exceed cache.seals")
    _require(h["prefix_caching"] or not any(c.values()), "cache", "must be all 0 in a trace without prefix caching")


def _validate_config(cfg: dict) -> None:
    _require(sorted(cfg) == sorted(CONFIG_KEYS), "config", f"must hold exactly {list(CONFIG_KEYS)}, got {sorted(cfg)}")
    try:
        check_config(**cfg)
    except ValueError as exc:
        raise TraceError(f"header field 'config': {exc}; {REGENERATE}") from None
    _require(cfg["num_blocks"] <= MAX_POOL_BLOCKS, "config.num_blocks", f"must be at most {MAX_POOL_BLOCKS}")
    _require(cfg["max_blocks_per_seq"] <= cfg["num_blocks"], "config.max_blocks_per_seq", "must not exceed num_blocks")
    _require(cfg["max_seqs"] * cfg["max_blocks_per_seq"] <= MAX_TABLE_ENTRIES, "config",
             f"max_seqs * max_blocks_per_seq must be at most {MAX_TABLE_ENTRIES}")


def _validate_counts(h: Mapping) -> None:
    cfg, ops = h["config"], h["ops_by_kind"]
    nbytes = (17 * h["num_ops"] + 28 * h["num_steps"] + 8 * h["cache"]["hashes"]
              + 4 * cfg["max_seqs"] * (1 + cfg["max_blocks_per_seq"]))
    _require(nbytes <= MAX_TRACE_BYTES, "num_ops", f"makes a trace of {nbytes} bytes, more than the {MAX_TRACE_BYTES} "
             "a trace may hold (fewer steps or sequences)")
    _require(sorted(ops) == sorted(OP_NAMES.values()) and all(map(_is_count, ops.values())), "ops_by_kind",
             f"must give a count >= 0 for each of {sorted(OP_NAMES.values())}")
    _require(sum(ops.values()) == h["num_ops"], "ops_by_kind", f"must add up to num_ops={h['num_ops']}")
    _require(h["peak_blocks_in_use"] <= cfg["num_blocks"], "peak_blocks_in_use", "must not exceed config.num_blocks")
    _require(h["final_free"] <= cfg["num_blocks"], "final_free", "must not exceed config.num_blocks")
    _require(h["live_at_end"] <= cfg["max_seqs"], "live_at_end", "must not exceed config.max_seqs")


def validate(trace: Trace) -> None:
    """Header schema, structure, checksum and end-state consistency; raises :class:`TraceError`."""
    h, a = trace.header, trace.arrays
    validate_header(h)
    for name, dtype in ARRAYS.items():
        if name not in a or a[name].dtype != np.dtype(dtype) or a[name].ndim != 1:
            raise TraceError(f"array {name!r} is missing or not a 1-D {np.dtype(dtype)} array")
    if h["checksum"] != checksum(h, a):
        raise TraceError("checksum mismatch: the file was modified or damaged after it was written")
    _validate_steps(h, a)
    _validate_ops(h, a)
    _validate_cache(h, a)
    _validate_end_state(h, a)


def _validate_steps(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    steps, n_ops = h["num_steps"], h["num_ops"]
    so, do = a["step_offsets"], a["decode_offsets"]
    if not (len(a["op"]) == len(a["a0"]) == len(a["a1"]) == n_ops):
        raise TraceError("op arrays disagree with num_ops")
    if len(so) != steps + 1 or len(do) != steps or len(a["step_cows"]) != steps:
        raise TraceError("step arrays disagree with num_steps")
    if so[0] != 0 or so[-1] != n_ops or np.any(np.diff(so) < 0) or np.any(do < so[:-1]) or np.any(do > so[1:]):
        raise TraceError("step offsets are not monotonic within the op arrays")
    if np.any(a["step_cows"] < 0) or int(a["step_cows"].sum()) != h["cow_count"]:
        raise TraceError("step_cows disagree with cow_count")


def _validate_ops(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    cfg, op, a0, a1 = h["config"], a["op"], a["a0"], a["a1"]
    if len(op) and op.max() > SEAL:
        raise TraceError(f"unknown op code {int(op.max())}")
    counts = np.bincount(op, minlength=len(OP_NAMES))
    if any(int(counts[code]) != h["ops_by_kind"][name] for code, name in OP_NAMES.items()):
        raise TraceError("ops_by_kind disagrees with the op array")
    rows = op != CAN_ALLOCATE
    if np.any(rows) and (a0[rows].min() < 0 or a0[rows].max() >= cfg["max_seqs"]):
        raise TraceError("row ids outside [0, max_seqs)")
    forks, allocs, asks, seals = op == FORK, (op == ALLOCATE) | (op == ALLOCATE_CACHED), op == CAN_ALLOCATE, op == SEAL
    if np.any(forks) and (a1[forks].min() < 0 or a1[forks].max() >= cfg["max_seqs"]):
        raise TraceError("fork targets outside [0, max_seqs)")
    if np.any(allocs) and (a1[allocs].min() < 1 or a1[allocs].max() > cfg["max_blocks_per_seq"] * cfg["block_size"]):
        raise TraceError("allocations outside [1, max_blocks_per_seq * block_size] tokens")
    if np.any(asks) and (a0[asks].min() < 0 or a1[asks].min() < 0 or a1[asks].max() > 1):
        raise TraceError("can_allocate ops with a negative count or an answer other than 0/1")
    if np.any(seals) and (a1[seals].min() < 0 or a1[seals].max() > 1):
        raise TraceError("seal ops with an answer other than 0/1")
    edges = np.zeros(len(op) + 1, dtype=np.int64)  # +1 where a decode part starts, -1 where it ends
    np.add.at(edges, a["decode_offsets"], 1)
    np.add.at(edges, a["step_offsets"][1:], -1)
    if np.any((op == APPEND) != (np.cumsum(edges)[:-1] > 0)):
        raise TraceError("appends must be exactly the decode part of each step")


def _validate_cache(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    """Hash indices, chain lengths and the cache totals (format 3)."""
    c, bs, op, a1, where = h["cache"], h["config"]["block_size"], a["op"], a["a1"], a["op_hash"]
    if len(a["hashes"]) != c["hashes"] or len(where) != h["num_ops"]:
        raise TraceError("hashes or op_hash disagree with the header's counts")
    if len(a["step_hits"]) != h["num_steps"] or len(a["step_evictions"]) != h["num_steps"]:
        raise TraceError("step_hits or step_evictions disagree with num_steps")
    cached, sealed = op == ALLOCATE_CACHED, op == SEAL
    if h["prefix_caching"] != bool(np.any(cached | sealed)):
        raise TraceError("header field 'prefix_caching' disagrees with the op array (prefix-caching ops or none)")
    if np.any(where[~(cached | sealed)] != -1):
        raise TraceError("op_hash must be -1 for every op but allocate_cached and seal")
    lengths = np.where(cached, a1.astype(np.int64) // bs, sealed.astype(np.int64))
    has = cached | sealed
    if np.any(has) and (where[has].min() < 0 or np.any(where[has] + lengths[has] > len(a["hashes"]))):
        raise TraceError("op_hash points outside the hashes array")
    if np.any(a["hashes"] == 0):
        raise TraceError("a block hash of 0 (hashes are in [1, 2**64))")
    totals = {"lookup_tokens": int(a1[cached].sum()), "lookup_blocks": int(lengths[cached].sum()),
              "hit_tokens": int(a["step_hits"].sum()), "evictions": int(a["step_evictions"].sum()),
              "seals": int(sealed.sum()), "seals_cached": int(a1[sealed].sum())}
    if np.any(a["step_hits"] < 0) or np.any(a["step_evictions"] < 0) or np.any(a["step_hits"] % bs):
        raise TraceError("step_hits must be whole blocks of tokens and step_evictions >= 0")
    if any(c[k] != v for k, v in totals.items()):
        raise TraceError(f"header field 'cache' disagrees with the arrays ({totals})")
    _validate_chains(a, np.flatnonzero(cached), lengths)


def _validate_chains(a: Mapping[str, np.ndarray], ops: np.ndarray, lengths: np.ndarray) -> None:
    """No hash twice within one prompt chain (a row holds a block once)."""
    hashes, where = a["hashes"], a["op_hash"]
    for i in ops.tolist():
        n = int(lengths[i])
        if n > 1 and len(np.unique(hashes[where[i] : where[i] + n])) != n:
            raise TraceError(f"op {i}: a hash twice in one prompt chain")


def _validate_end_state(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    cfg, lens, canon = h["config"], a["final_lens"], a["final_canon"]
    if len(lens) != cfg["max_seqs"]:
        raise TraceError("final_lens must have one entry per row")
    if np.any(lens < 0) or np.any(lens > cfg["max_blocks_per_seq"] * cfg["block_size"]):
        raise TraceError("final_lens outside [0, max_blocks_per_seq * block_size]")
    if int(np.count_nonzero(lens)) != h["live_at_end"]:
        raise TraceError("final_lens disagree with live_at_end")
    if len(canon) != int(blocks_for(lens.astype(np.int64), cfg["block_size"]).sum()):
        raise TraceError("final_canon does not hold the block tables of final_lens")
    in_use = int(canon.max()) + 1 if len(canon) else 0
    if (len(canon) and canon.min() < 0) or cfg["num_blocks"] - in_use != h["final_free"]:
        raise TraceError("final_canon disagrees with final_free")
