"""Hashing alone: what prefix caching costs before a manager sees a hash. Design: docs/measurement.md#block_hashing."""

from __future__ import annotations

import hashlib
import pickle
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.base.rows import Row
from scenarios import PAPER
from scenarios.trace import ALLOCATE, ALLOCATE_CACHED, APPEND, FORK, Trace

BLOCK = 16
CHAIN = 2000
RUNS = 7
SOURCE = "perf_counter_ns"
NONE_HASH_SEED = "vllm-none-hash"  # vLLM's fixed seed for cryptographic algorithms (PYTHONHASHSEED unset)


@dataclass(frozen=True)
class Hasher:
    """One engine's block hash: ``make()`` returns ``(first_parent, hash_block)`` or raises ImportError."""

    name: str
    engine: str
    what: str
    make: Callable[[], tuple[object, Callable[[object, list[int]], object]]]


def _vllm_pickle(digest: Callable[[bytes], bytes]) -> tuple[object, Callable]:
    def fn(obj: object) -> bytes:
        return digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def hash_block(parent: object, tokens: list[int]) -> bytes:
        return fn((parent, tuple(tokens), None))

    return fn(NONE_HASH_SEED), hash_block


def _sha256() -> tuple[object, Callable]:
    return _vllm_pickle(lambda data: hashlib.sha256(data).digest())


def _sha256_cbor() -> tuple[object, Callable]:
    import cbor2

    def fn(obj: object) -> bytes:
        return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()

    def hash_block(parent: object, tokens: list[int]) -> bytes:
        return fn((parent, tuple(tokens), None))

    return fn(NONE_HASH_SEED), hash_block


def _xxhash() -> tuple[object, Callable]:
    import xxhash

    return _vllm_pickle(xxhash.xxh3_128_digest)


def _builtin() -> tuple[object, Callable]:
    def hash_block(parent: object, tokens: list[int]) -> int:
        return hash((parent, tuple(tokens), None))

    return hash(NONE_HASH_SEED), hash_block


def _nano_xxh64() -> tuple[object, Callable]:
    import xxhash

    def hash_block(parent: int, tokens: list[int]) -> int:
        h = xxhash.xxh64()
        if parent != -1:
            h.update(parent.to_bytes(8, "little"))
        h.update(np.array(tokens).tobytes())
        return h.intdigest()

    return -1, hash_block


HASHERS = (
    Hasher("vllm-sha256", "vLLM 0.33", "sha256(pickle((parent, tokens, None))), the default", _sha256),
    Hasher("vllm-sha256_cbor", "vLLM 0.33", "sha256(cbor2 canonical((parent, tokens, None)))", _sha256_cbor),
    Hasher("vllm-xxhash", "vLLM 0.33", "xxh3_128(pickle((parent, tokens, None)))", _xxhash),
    Hasher("python-hash", "vLLM, former default", "builtin hash((parent, tokens, None))", _builtin),
    Hasher("nano-vllm-xxh64", "nano-vllm", "xxh64(parent as 8 bytes + token ids as NumPy bytes)", _nano_xxh64),
)


def _time_chain(first: object, hash_block: Callable, blocks: list[list[int]]) -> int:
    perf = time.perf_counter_ns
    parent = first
    t0 = perf()
    for tokens in blocks:
        parent = hash_block(parent, tokens)
    return perf() - t0


def measure(chain: int = CHAIN, runs: int = RUNS) -> dict[str, dict]:
    """name -> {"ns": per-block times of each run} or {"unavailable": why}."""
    blocks = [list(range(i * BLOCK, (i + 1) * BLOCK)) for i in range(chain)]
    ready, out = {}, {}
    for h in HASHERS:
        try:
            ready[h.name] = h.make()
        except ImportError as exc:
            out[h.name] = {"unavailable": f"{exc.name or exc} not installed (pip install -e '.[hashing]')"}
    for name, (first, fn) in ready.items():
        _time_chain(first, fn, blocks[:100])
        out[name] = {"ns": []}
    names = list(ready)
    for r in range(runs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            first, fn = ready[name]
            out[name]["ns"].append(_time_chain(first, fn, blocks) / chain)
    return out


def hashes_per_seq_step(trace: Trace) -> float:
    """Block hashes an engine with prefix caching computes per sequence-step of ``trace``: every full block of every
    admitted prompt (a forked child is a request with its parent's tokens) and every block a decode append fills."""
    bs = trace.config["block_size"]
    lens, op = trace.op_lengths(), trace.op
    admitted = (op == ALLOCATE) | (op == ALLOCATE_CACHED) | (op == FORK)
    hashes = int(((op == APPEND) & (lens % bs == 0)).sum()) + int((lens[admitted] // bs).sum())
    return hashes / max(1, int(trace.running_per_step().sum()))


def hashing_rows(trace: Trace, scenario: str, chain: int = CHAIN, runs: int = RUNS) -> list[Row]:
    """Rows per algorithm (unavailable ones as such)."""
    per_step = hashes_per_seq_step(trace)
    rows = []
    for h in HASHERS:
        case = measure_cache(chain, runs)[h.name]
        if "unavailable" in case:
            for metric in ("hash_ns_per_block", "hash_ns_per_seq_step"):
                rows.append(Row(scenario, h.name, "hash", metric, float("nan"), "ns", SOURCE,
                                status="unavailable", how=case["unavailable"]))
            continue
        ns = case["ns"]
        med = statistics.median(ns)
        how = (f"{h.engine}: {h.what}; {chain} chained blocks of {BLOCK} token ids per loop, median of {len(ns)} loops "
               f"interleaved with the other algorithms (interval: lowest and highest loop)")
        rows.append(Row(scenario, h.name, "hash", "hash_ns_per_block", med, "ns", SOURCE, how=how,
                        reps=len(ns), ci_low=min(ns), ci_high=max(ns)))
        rows.append(Row(scenario, h.name, "hash", "hash_ns_per_seq_step", med * per_step, "ns", SOURCE,
                        how=f"{med:.0f} ns per block x {per_step:.4f} blocks hashed per sequence-step of "
                            f"{scenario} (every admitted prompt's full blocks, every block decode fills)",
                        reps=len(ns), ci_low=min(ns) * per_step, ci_high=max(ns) * per_step))
    return rows


_CACHE: dict[tuple[int, int], dict] = {}


def measure_cache(chain: int, runs: int) -> dict[str, dict]:
    """:func:`measure`, once per process and arguments: the per-block figure does not depend on the trace."""
    key = (chain, runs)
    if key not in _CACHE:
        _CACHE[key] = measure(chain, runs)
    return _CACHE[key]


def main(argv: list[str] | None = None) -> int:
    """Print the figures for one scenario (default ``paper``)."""
    import sys

    from scenarios import generate

    args = sys.argv[1:] if argv is None else argv
    scenario = args[0] if args else PAPER
    for row in hashing_rows(generate(scenario), scenario):
        value = "unavailable" if row.status != "ok" else f"{row.value:,.1f} ns [{row.ci_low:,.1f}, {row.ci_high:,.1f}]"
        print(f"{row.impl:18} {row.metric:22} {value}  ({row.how})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
