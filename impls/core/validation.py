"""The contract's input checks, written once for both worlds."""

from __future__ import annotations

import os
import sys

import numpy as np
from numba import njit

from impls.contract import (
    ALLOCATE_CACHED,
    APPEND,
    E_ACTIVE,
    E_BLOCK_RANGE,
    E_BUFFER,
    E_COUNT,
    E_DUPLICATE,
    E_HASH,
    E_INACTIVE,
    E_SEQ_RANGE,
    E_TOKENS,
    E_TOO_LONG,
    OK,
    SEAL,
    STEP_EXTRA,
    STEP_OPS,
    blocks_needed,
    raise_for,
)
from impls.core.jit import specialise


def check_active(lens, seq):
    """Range, then active."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    if lens[seq] == 0:
        return E_INACTIVE
    return OK


def check_allocate(lens, max_blocks, shift, seq, num_tokens):
    """Range, token count and size, then the row must be free."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    if num_tokens < 1:
        return E_TOKENS
    if blocks_needed(num_tokens, shift) > max_blocks:
        return E_TOO_LONG
    if lens[seq] != 0:
        return E_ACTIVE
    return OK


def check_append(lens, max_blocks, shift, seq):
    """Range, active, then room for one more token (a new block at a boundary)."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    n = lens[seq]
    if n == 0:
        return E_INACTIVE
    if n & ((1 << shift) - 1) == 0 and n >> shift >= max_blocks:
        return E_TOO_LONG
    return OK


def check_fork(lens, parent, child):
    """Both ids in range, parent active, child free."""
    if parent < 0 or parent >= len(lens) or child < 0 or child >= len(lens):
        return E_SEQ_RANGE
    if lens[parent] == 0:
        return E_INACTIVE
    if lens[child] != 0:
        return E_ACTIVE
    return OK


def slot_of(block, pos, shift):
    """Physical KV slot of token position ``pos`` when its block is ``block``."""
    return (block << shift) | (pos & ((1 << shift) - 1))


blocks_needed_jit = njit(cache=True, inline="always")(blocks_needed)
slot_of_jit = njit(cache=True, inline="always")(slot_of)
check_active_jit = njit(cache=True, inline="always")(check_active)
check_allocate_jit = njit(cache=True, inline="always")(
    specialise(check_allocate, "jit", blocks_needed=blocks_needed_jit))
check_append_jit = njit(cache=True, inline="always")(check_append)
check_fork_jit = njit(cache=True, inline="always")(check_fork)


@njit(cache=True, inline="always")
def check_batch_jit(lens, marks, stamp, max_blocks, shift, seq_ids):
    """A compiled decode step's validation pass: every id valid for an append and listed once."""
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[i]
        rc = check_append_jit(lens, max_blocks, shift, seq)
        if rc != OK:
            return rc, i
        if marks[seq] == stamp:
            return E_DUPLICATE, i
        marks[seq] = stamp
    return OK, 0



INT64 = np.dtype(np.int64)
_ndarray = np.ndarray
_C_CONTIGUOUS, _OWNDATA, _ALIGNED, _WRITEABLE = 0x1, 0x4, 0x100, 0x400
_USABLE = _C_CONTIGUOUS | _ALIGNED | _WRITEABLE
_INPUT = _C_CONTIGUOUS | _ALIGNED
_INT64_MAX = 2**63 - 1


def as_int(value: object, name: str) -> int:
    """``value`` as a Python int; bool or anything but an integer is a ``TypeError``."""
    if type(value) is int:
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{name} must be an int or a NumPy integer, got {type(value).__name__} {value!r}")


def seq_arg(value: object, max_seqs: int) -> int:
    seq = value if type(value) is int else as_int(value, "sequence id")
    if seq < 0 or seq >= max_seqs:
        raise_for(E_SEQ_RANGE, seq=seq, max_seqs=max_seqs)
    return seq


def tokens_arg(value: object, seq: int, max_blocks: int, shift: int) -> int:
    """A prompt length in ``[1, max_blocks * block_size]`` (so it fits the compiled designs' int32 lengths)."""
    n = value if type(value) is int else as_int(value, "num_tokens")
    if n < 1:
        raise_for(E_TOKENS, num_tokens=n)
    if n > max_blocks << shift:
        raise_for(E_TOO_LONG, seq=seq, max_blocks=max_blocks)
    return n


def count_arg(value: object) -> int:
    n = value if type(value) is int else as_int(value, "num_blocks")
    if n < 0:
        raise_for(E_COUNT, need=n)
    return n


def block_arg(value: object, num_blocks: int) -> int:
    block = value if type(value) is int else as_int(value, "block id")
    if block < 0 or block >= num_blocks:
        raise_for(E_BLOCK_RANGE, block=block, num_blocks=num_blocks)
    return block


def _int64_vector(values: object, name: str, max_seqs: int | None = None) -> np.ndarray:
    """``values`` as a C-contiguous int64 vector; ``TypeError`` unless a 1-D integer array."""
    if not isinstance(values, _ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(values).__name__}")
    dtype = values.dtype
    if dtype is INT64 and values.ndim == 1 and values.flags.c_contiguous:
        return values
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {values.shape}")
    if dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {dtype}")
    if dtype.kind == "u" and dtype.itemsize == 8 and values.size and int(values.max()) > _INT64_MAX:
        if max_seqs is not None:
            raise_for(E_SEQ_RANGE, seq=int(values.max()), max_seqs=max_seqs)
        raise ValueError(f"{name} holds {int(values.max())}, beyond int64")
    return np.ascontiguousarray(values, dtype=INT64)


def _out_arg(buf: object, name: str, ndim: int, n: int) -> np.ndarray | None:
    """Check an output buffer the kernels may write ``n`` rows of (int64, C-contiguous, aligned, writeable)."""
    if not isinstance(buf, _ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(buf).__name__}")
    if buf.dtype is not INT64 and buf.dtype != INT64:
        raise TypeError(f"{name} must have dtype int64 (native byte order), got {buf.dtype}")
    shape = buf.shape
    if len(shape) != ndim or (ndim == 2 and shape[1] != 2):
        raise ValueError(f"{name} must have shape {'(rows, 2)' if ndim == 2 else '(rows,)'}, got {shape}")
    flags = buf.flags.num
    if flags & _USABLE != _USABLE:
        if not flags & _WRITEABLE:
            raise ValueError(f"{name} must be writeable")
        raise ValueError(f"{name} must be C-contiguous and aligned")
    if shape[0] < n:
        raise_for(E_BUFFER, capacity=shape[0], need=n)
    base = buf.base
    if base is None:
        return buf if flags & _OWNDATA else None
    return _owner(base)


def _owner(a: np.ndarray) -> np.ndarray | None:
    """The array owning the memory ``a`` views, when NumPy allocated it; None for a foreign buffer."""
    base = a.base
    while isinstance(base, _ndarray):
        a, base = base, base.base
    return a if base is None and a.flags.num & _OWNDATA else None


def _refuse_overlap(*arrays: np.ndarray) -> None:
    """``ValueError`` when any two of ``arrays`` may share memory (the slow path: same or unknown owners)."""
    for i, a in enumerate(arrays):
        for b in arrays[i + 1 :]:
            if np.may_share_memory(a, b):
                raise ValueError("seq_ids, cow_out and slot_out must not overlap one another")


def batch_args(seq_ids: object, cow_out: object, slot_out: object, max_seqs: int) -> np.ndarray:
    """Arguments of ``decode_step``; returns the ids as C-contiguous int64."""
    ids = _int64_vector(seq_ids, "seq_ids", max_seqs)
    n = ids.shape[0]
    c = _out_arg(cow_out, "cow_out", 2, n)
    s = _out_arg(slot_out, "slot_out", 1, n)
    i = _owner(ids)
    if c is None or s is None or i is None or c is s or i is c or i is s:
        _refuse_overlap(ids, cow_out, slot_out)
    return ids


def lookup_args(seq_ids: object, slot_out: object, max_seqs: int) -> np.ndarray:
    """Arguments of ``lookup``; returns the ids as C-contiguous int64. ``slot_out`` must not overlap them."""
    ids = _int64_vector(seq_ids, "seq_ids", max_seqs)
    s = _out_arg(slot_out, "slot_out", 1, ids.shape[0])
    i = _owner(ids)
    if s is None or i is None or s is i:
        _refuse_overlap(ids, slot_out)
    return ids


def step_args(ops: object, a0: object, a1: object, seq_ids: object, status_out: object, cow_out: object,
              slot_out: object, max_seqs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Arguments of ``step``; returns ``ops``, ``a0``, ``a1`` and the decode ids as C-contiguous int64."""
    if step_fast(ops, a0, a1, seq_ids, status_out, cow_out, slot_out):
        return ops, a0, a1, seq_ids
    return _step_args(ops, a0, a1, seq_ids, status_out, cow_out, slot_out, max_seqs)


def step_fast(ops: object, a0: object, a1: object, seq_ids: object, status_out: object, cow_out: object,
              slot_out: object) -> bool:
    """Whether ``step``'s buffers are an engine's usual ones, which the compiled step checks cheaply."""
    if (type(ops) is _ndarray and type(a0) is _ndarray and type(a1) is _ndarray and type(seq_ids) is _ndarray
            and type(status_out) is _ndarray and type(cow_out) is _ndarray and type(slot_out) is _ndarray
            and ops.dtype is INT64 and a0.dtype is INT64 and a1.dtype is INT64 and seq_ids.dtype is INT64
            and status_out.dtype is INT64 and cow_out.dtype is INT64 and slot_out.dtype is INT64):
        shape, n = ops.shape, seq_ids.shape
        out_flags = status_out.flags.num & cow_out.flags.num & slot_out.flags.num
        # Outputs owning their memory cannot overlap one another; an input overlaps one only by being (a view of) it.
        if (len(shape) == 1 and a0.shape == shape and a1.shape == shape and len(n) == 1
                and ops.flags.num & a0.flags.num & a1.flags.num & seq_ids.flags.num & _INPUT == _INPUT
                and out_flags & (_USABLE | _OWNDATA) == _USABLE | _OWNDATA
                and status_out.base is None and cow_out.base is None and slot_out.base is None
                and status_out.ndim == 1 and slot_out.ndim == 1 and cow_out.ndim == 2 and cow_out.shape[1] == 2
                and status_out.shape[0] >= shape[0] + STEP_EXTRA and cow_out.shape[0] >= n[0]
                and slot_out.shape[0] >= n[0] and status_out is not cow_out and status_out is not slot_out
                and cow_out is not slot_out):
            outs = (status_out, cow_out, slot_out)
            return all(_known_input(a, outs) for a in (ops, a0, a1, seq_ids))
    return False


def _known_input(a: np.ndarray, outs: tuple) -> bool:
    """Whether input ``a`` views memory NumPy allocated for an array other than the outputs ``outs``."""
    owner = _owner(a)
    return owner is not None and not any(owner is o for o in outs)


def _step_args(ops: object, a0: object, a1: object, seq_ids: object, status_out: object, cow_out: object,
               slot_out: object, max_seqs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`step_args` in full: every check, each with its own message."""
    ops, a0, a1 = _int64_vector(ops, "ops"), _int64_vector(a0, "a0"), _int64_vector(a1, "a1")
    m = ops.shape[0]
    if a0.shape[0] != m or a1.shape[0] != m:
        raise ValueError(f"ops, a0 and a1 must have one length, got {m}, {a0.shape[0]} and {a1.shape[0]}")
    ids = _int64_vector(seq_ids, "seq_ids", max_seqs)
    n = ids.shape[0]
    outs = (_out_arg(status_out, "status_out", 1, 0), _out_arg(cow_out, "cow_out", 2, n),
            _out_arg(slot_out, "slot_out", 1, n))
    if status_out.shape[0] < m + STEP_EXTRA:
        raise ValueError(f"status_out holds {status_out.shape[0]} entries, the step needs {m + STEP_EXTRA} "
                         f"({m} ops, then the decode batch's status and detail)")
    so, co, lo = outs
    ins = {id(_owner(ops)), id(_owner(a0)), id(_owner(a1)), id(_owner(ids))}
    if (so is None or co is None or lo is None or so is co or so is lo or co is lo or _NONE in ins
            or id(so) in ins or id(co) in ins or id(lo) in ins):
        _refuse_step_overlap((ops, a0, a1, ids), (status_out, cow_out, slot_out))
    return ops, a0, a1, ids


def refuse_op(index: int, code: int) -> None:
    """``ValueError`` for op ``index`` of a step, whose code ``code`` is not one :meth:`step` takes."""
    if code in (ALLOCATE_CACHED, SEAL):
        raise ValueError(f"ops[{index}] is {code} ({'ALLOCATE_CACHED' if code == ALLOCATE_CACHED else 'SEAL'}): "
                         "prefix-caching ops are reserved and not taken by step yet")
    if code == APPEND:
        raise ValueError(f"ops[{index}] is APPEND ({APPEND}): decode appends go in seq_ids, not among the ops")
    raise ValueError(f"ops[{index}] is {code}, not an op code step takes ({', '.join(map(str, STEP_OPS))})")


def check_step_ops(codes: list[int]) -> None:
    """Every op code one :meth:`step` takes, else :func:`refuse_op` for the first that is not."""
    for i, code in enumerate(codes):
        if code not in _STEP_OPS:
            refuse_op(i, code)


_STEP_OPS = frozenset(STEP_OPS)
_NONE = id(None)


def _refuse_step_overlap(ins: tuple[np.ndarray, ...], outs: tuple[np.ndarray, ...]) -> None:
    """``ValueError`` when an output may share memory with another output or with an input (the slow path)."""
    for i, out in enumerate(outs):
        for other in (*outs[i + 1 :], *ins):
            if np.may_share_memory(out, other):
                raise ValueError("status_out, cow_out and slot_out must not overlap one another or the inputs")



_UINT64 = np.dtype(np.uint64)
_HASH_LIMIT = 2**64


def hash_arg(value: object, seq: int) -> int:
    """A block hash in ``[1, 2**64)`` as a Python int; anything else is ``ValueError`` (``E_HASH``)."""
    if type(value) is int or (isinstance(value, (int, np.integer)) and not isinstance(value, bool)):
        h = int(value)
        if 0 < h < _HASH_LIMIT:
            return h
    raise_for(E_HASH, seq=seq, why=f"block hash {value!r} is not an integer in [1, 2**64)")
    raise AssertionError


def chain_shape_arg(hashes: object, num_tokens: int, shift: int, seq: int) -> np.ndarray:
    """A hash chain's structure: 1-D, C-contiguous, aligned ``uint64``, a hash per full block; else ``E_HASH``."""
    if not isinstance(hashes, _ndarray):
        raise_for(E_HASH, seq=seq, why=f"hashes must be a numpy.ndarray, got {type(hashes).__name__}")
    if hashes.dtype is not _UINT64 and hashes.dtype != _UINT64:
        raise_for(E_HASH, seq=seq, why=f"hashes must have dtype uint64 (native byte order), got {hashes.dtype}")
    if hashes.ndim != 1:
        raise_for(E_HASH, seq=seq, why=f"hashes must be 1-D, got shape {hashes.shape}")
    flags = hashes.flags.num
    if flags & (_C_CONTIGUOUS | _ALIGNED) != _C_CONTIGUOUS | _ALIGNED:
        raise_for(E_HASH, seq=seq, why="hashes must be C-contiguous and aligned")
    if hashes.shape[0] != num_tokens >> shift:
        raise_for(E_HASH, seq=seq, why=f"{hashes.shape[0]} hashes for {num_tokens >> shift} full blocks")
    return hashes


def chain_problem(hashes: np.ndarray) -> str:
    """What is wrong with a well-shaped chain's entries ("" when nothing): an entry 0 or a hash twice."""
    zeros = np.flatnonzero(hashes == 0)
    if zeros.size:
        return f"entry {int(zeros[0])} is 0 (reserved)"
    values, counts = np.unique(hashes, return_counts=True)
    if (counts > 1).any():
        return f"hash {int(values[counts > 1][0])} appears twice in one chain"
    return ""


def chain_arg(hashes: object, num_tokens: int, shift: int, seq: int) -> np.ndarray:
    """A prompt's hash chain, its structure and entries checked; else ``ValueError`` (``E_HASH``)."""
    chain = chain_shape_arg(hashes, num_tokens, shift, seq)
    why = chain_problem(chain)
    if why:
        raise_for(E_HASH, seq=seq, why=why)
    return chain




def int_object_bytes(num_blocks: int) -> int:
    """Bytes of one Python int object holding a block id below ``num_blocks`` (ids past 256 are not shared)."""
    return sys.getsizeof(max(num_blocks - 1, 257))


def available_memory() -> int | None:
    """Bytes this machine can give a new allocation now (``MemAvailable``, else free pages); None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_memory(nbytes: int, what: str) -> None:
    """``MemoryError`` before construction when the design's estimate ``nbytes`` exceeds what is available."""
    available = available_memory()
    if available is not None and nbytes > available:
        raise MemoryError(
            f"{what} needs at least {nbytes / 2**30:.2f} GiB at construction, this machine has "
            f"{available / 2**30:.2f} GiB available: lower num_blocks, max_seqs or max_blocks_per_seq"
        )
