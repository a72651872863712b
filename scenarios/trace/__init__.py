"""The decode trace: the contract calls a scheduler issues, step by step, as flat NumPy arrays.

A trace is three parallel op arrays (``op``, ``a0``, ``a1``) cut into steps by ``step_offsets``. Within a
step the pool operations come first and the decode appends last, from ``decode_offsets[s]`` to
``step_offsets[s + 1]``. It carries what a correct replay must end with (free count, row lengths, block tables up
to renaming) and each step's copy-on-writes. File format: :mod:`scenarios.trace.file_format`,
:mod:`scenarios.trace.storage`; checks: :mod:`scenarios.trace.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from impls.contract import (  # noqa: F401  (the op codes, re-exported for the harness)
    ALLOCATE,
    ALLOCATE_CACHED,
    APPEND,
    CAN_ALLOCATE,
    FORK,
    FREE,
    OP_NAMES,
    SEAL,
)

# Op codes (defined once, in impls.contract, which the whole-step entry point shares); a0/a1 per op:
# CAN_ALLOCATE a0 = blocks asked for, a1 = the answer the scheduler got (1/0); ALLOCATE a0 = row, a1 = tokens;
# FORK a0 = parent row, a1 = child row; FREE a0 = row; APPEND a0 = row (decode appends, the last part of each
# step). Prefix caching (format version 3; see impls.contract.CachingBlockManager), ``op_hash[i]`` indexes
# ``hashes``: ALLOCATE_CACHED a0 = row, a1 = tokens, chain = hashes[op_hash[i] : op_hash[i] + a1 // block_size];
# SEAL a0 = row, a1 = the answer seal() gave (1/0), hash = hashes[op_hash[i]], a pool op of the step after the
# decode that filled the block.

ARRAYS = {  # name -> dtype
    "op": np.uint8,
    "a0": np.int32,
    "a1": np.int32,
    "step_offsets": np.int64,
    "decode_offsets": np.int64,
    "step_cows": np.int32,
    "final_lens": np.int32,
    "final_canon": np.int32,
    "hashes": np.uint64,  # format 3: the hash chains of ALLOCATE_CACHED ops and the hashes of SEAL ops
    "op_hash": np.int64,  # per op: index into hashes (ALLOCATE_CACHED, SEAL), else -1
    "step_hits": np.int32,  # per step: prompt tokens the cache served (the reference model's answers)
    "step_evictions": np.int32,  # per step: cached blocks evicted
}


class TraceError(ValueError):
    """A trace file that cannot be used: truncated, corrupted, edited, or of another format version."""


@dataclass
class Trace:
    """A loaded or freshly generated trace. ``header["config"]`` holds the BlockManager arguments."""

    header: dict
    arrays: dict[str, np.ndarray] = field(repr=False)

    @property
    def config(self) -> dict:
        """Keyword arguments for an implementation's constructor."""
        return dict(self.header["config"])

    @property
    def num_steps(self) -> int:
        return int(self.header["num_steps"])

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    def decode_ids(self, step: int) -> np.ndarray:
        """Row ids the decode step of ``step`` appends to, in order (a view of ``a0``)."""
        return self.a0[int(self.decode_offsets[step]) : int(self.step_offsets[step + 1])]

    def running_per_step(self) -> np.ndarray:
        """Number of sequences decoding in each step."""
        return (self.step_offsets[1:] - self.decode_offsets).astype(np.int64)

    def chain(self, i: int) -> np.ndarray:
        """The hashes op ``i`` carries (a uint64 view of ``hashes``): an ``ALLOCATE_CACHED`` op's prompt chain,
        a ``SEAL`` op's one hash; empty for the other ops."""
        op, start = int(self.op[i]), int(self.op_hash[i])
        n = int(self.a1[i]) // self.config["block_size"] if op == ALLOCATE_CACHED else int(op == SEAL)
        return self.hashes[start : start + n] if start >= 0 else self.hashes[:0]

    def op_lengths(self) -> np.ndarray:
        """Per op, the length in tokens of the row it concerns, tracked through the trace (the one walk of row
        lengths): ``ALLOCATE``/``ALLOCATE_CACHED``: the prompt (``a1``); ``APPEND``: the row after the append;
        ``FREE``: the row as it was freed; ``FORK``: the parent's (the child's after the fork); ``CAN_ALLOCATE``:
        0; ``SEAL``: the row's."""
        lens = [0] * self.config["max_seqs"]
        out = np.zeros(len(self.op), dtype=np.int64)
        for i, (o, x, y) in enumerate(zip(self.op.tolist(), self.a0.tolist(), self.a1.tolist(), strict=True)):
            if o == APPEND:
                lens[x] += 1
            elif o in (ALLOCATE, ALLOCATE_CACHED):
                lens[x] = y
            elif o == FORK:
                lens[y] = lens[x]
            if o != CAN_ALLOCATE:
                out[i] = lens[x]
            if o == FREE:
                lens[x] = 0
        return out

    def cache_summary(self) -> dict:
        """The prefix-caching totals, with hit rates (tokens and blocks) and evictions per step."""
        c = self.header["cache"]

        def rate(hit: int, of: int) -> str:
            return f"{hit} of {of} ({100 * hit / of:.1f} %)" if of else f"{hit} of {of}"

        return {
            "prefix caching": self.header["prefix_caching"],
            "cache hit tokens": rate(c["hit_tokens"], c["lookup_tokens"]),
            "cache hit blocks": rate(c["hit_blocks"], c["lookup_blocks"]),
            "cache evictions": f"{c['evictions']} ({c['evictions'] / self.num_steps:.2f} per step)",
            "cache seals": f"{c['seals']} ({c['seals_cached']} cached)",
        }

    def summary(self) -> dict:
        """What ``kvblock-bench trace --show`` prints."""
        h = self.header
        running = self.running_per_step()
        return {
            "scenario": h["scenario"],
            "steps": h["num_steps"],
            "requests": h["num_requests"],
            "running per step (min/mean/max)": f"{running.min()}/{running.mean():.1f}/{running.max()}",
            "sequence-steps": int(running.sum()),
            "ops": h["num_ops"],
            **{f"ops {k}": v for k, v in h["ops_by_kind"].items()},
            "peak blocks in use": f"{h['peak_blocks_in_use']} of {h['config']['num_blocks']}",
            "copy-on-writes": h["cow_count"],
            "preemptions": h["preemptions"],
            "live at end": h["live_at_end"],
            **self.cache_summary(),
            "config": h["config"],
            "params": h["params"],
            "seed": h["seed"],
        }


def trace_uses_caching(trace: Trace) -> bool:
    """Whether ``trace`` holds prefix-caching ops (``ALLOCATE_CACHED``, ``SEAL``): only a manager with prefix caching
    (:func:`impls.contract.supports_prefix_caching`) and a driver that knows these ops can replay it."""
    return bool(trace.header.get("prefix_caching", False))


def canonical_tables(tables: Mapping[int, Sequence[int]]) -> list[int]:
    """Block tables of the given rows (in row order), with ids renamed in order of first appearance.

    Two managers in the same state give the same list whatever ids their pools handed out; sharing
    (the same block in two tables) is preserved.
    """
    names: dict[int, int] = {}
    out: list[int] = []
    for row in sorted(tables):
        for block in tables[row]:
            out.append(names.setdefault(int(block), len(names)))
    return out
