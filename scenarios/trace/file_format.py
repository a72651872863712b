"""The trace file format: its name and versions, header fields, limits, and the checksum over header and arrays.

Files are ``.npz``: a ``header`` member (JSON as uint8) and one ``.npy`` member per array of
:data:`scenarios.trace.ARRAYS`. Format 3 adds prefix caching (``hashes``, ``op_hash``, ``step_hits``,
``step_evictions``; the header's ``prefix_caching`` and ``cache`` totals); format 2 files load as traces without it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

import numpy as np

from impls.contract import ALLOCATE_CACHED, SEAL

from . import ARRAYS, Trace

FORMAT = "kvblock-bench-trace"
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)  # 2: before prefix caching, loaded as a trace without it
V2_ARRAYS = ("op", "a0", "a1", "step_offsets", "decode_offsets", "step_cows", "final_lens", "final_canon")
V2_HEADER_KEYS = {
    "format", "version", "scenario", "generator_version", "params", "seed", "config", "num_steps", "num_ops",
    "num_requests", "peak_blocks_in_use", "cow_count", "preemptions", "final_free", "live_at_end", "ops_by_kind",
    "checksum",
}
HEADER_KEYS = V2_HEADER_KEYS | {"prefix_caching", "cache"}
# header["cache"]: totals over the trace (all 0 without prefix caching)
CACHE_KEYS = (
    "hashes",  # entries of the hashes array
    "lookup_tokens",  # prompt tokens of ALLOCATE_CACHED ops
    "lookup_blocks",  # full prompt blocks looked up (the chains' lengths)
    "hit_tokens",  # prompt tokens served from the cache (sum of step_hits)
    "hit_blocks",  # hit_tokens / block_size
    "evictions",  # cached blocks evicted (sum of step_evictions)
    "seals",  # SEAL ops
    "seals_cached",  # SEAL ops whose block became cached (a1 = 1)
)

# Limits a file is held to before anything is decompressed (a few MB of zip may claim gigabytes).
MAX_HEADER_BYTES = 1 << 20  # the JSON header
MAX_TRACE_BYTES = 1 << 30  # all arrays together, in memory
MAX_POOL_BLOCKS = 1 << 24  # num_blocks of a trace's configuration
MAX_TABLE_ENTRIES = 1 << 28  # max_seqs * max_blocks_per_seq (a dense block table of that many int32)
REGENERATE = "regenerate it with `kvblock-bench trace`"
COUNT_FIELDS = ("num_steps", "num_ops", "num_requests", "peak_blocks_in_use", "cow_count", "preemptions",
                "final_free", "live_at_end", "generator_version", "seed")
CONFIG_KEYS = ("num_blocks", "block_size", "max_seqs", "max_blocks_per_seq")


def checksum(header: Mapping, arrays: Mapping[str, np.ndarray], names: Iterable[str] = ARRAYS) -> str:
    """SHA-256 of the header (less its ``checksum``) and the arrays ``names``: what a file's checksum is."""
    body = {k: v for k, v in header.items() if k != "checksum"}
    return _digest(json.dumps(body, sort_keys=True).encode(), arrays, names)


def content_digest(trace: Trace) -> str:
    """Identity of the work a trace asks for (configuration and ops), whatever its scenario is called."""
    return _digest(json.dumps(trace.header["config"], sort_keys=True).encode(), trace.arrays)


def _digest(prefix: bytes, arrays: Mapping[str, np.ndarray], names: Iterable[str] = ARRAYS) -> str:
    digest = hashlib.sha256(prefix)
    for name in sorted(names):
        arr = np.ascontiguousarray(arrays[name], dtype=ARRAYS[name])
        digest.update(name.encode())
        digest.update(str(arr.shape).encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def cache_totals(arrays: Mapping[str, np.ndarray], block_size: int) -> dict:
    """The header's ``prefix_caching`` flag and ``cache`` totals, from the arrays."""
    op, a1 = arrays["op"], arrays["a1"].astype(np.int64)
    cached, sealed = op == ALLOCATE_CACHED, op == SEAL
    hit_tokens = int(arrays["step_hits"].sum())
    cache = {"hashes": len(arrays["hashes"]), "lookup_tokens": int(a1[cached].sum()),
             "lookup_blocks": int((a1[cached] // block_size).sum()), "hit_tokens": hit_tokens,
             "hit_blocks": hit_tokens // block_size, "evictions": int(arrays["step_evictions"].sum()),
             "seals": int(sealed.sum()), "seals_cached": int(a1[sealed].sum())}
    return {"prefix_caching": bool(np.any(cached | sealed)), "cache": cache}
