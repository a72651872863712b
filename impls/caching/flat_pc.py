"""``flat-pc``: ``flat`` with prefix caching, still Numba kernels over preallocated arrays."""

from __future__ import annotations

import numpy as np
from numba import njit

from impls.contract import (
    E_ACTIVE,
    E_BUFFER,
    E_COUNT,
    E_HASH,
    E_INACTIVE,
    E_NO_BLOCKS,
    E_NOT_FULL,
    E_SEALED,
    E_SEQ_RANGE,
    OK,
)
from impls.core.compiled import CachingKernels
from impls.core.jit import specialise
from impls.core.pages import resident_zeros
from impls.core.validation import chain_problem, chain_shape_arg, hash_arg, lookup_args, seq_arg, tokens_arg
from impls.designs import flat
from impls.designs.flat import (
    BLOCK_SHIFT,
    HEADER,
    LEN,
    MARK,
    NEXT,
    NUM_BLOCKS,
    ROW,
    SAVED,
    SHARED,
    TOP,
    FlatBlockManager,
    offsets,
    store,
)

EVICT, HEAD, TAIL, CACHED, CAP_BITS, SCR_BITS, SCR_STAMP, DETAIL = range(8)
FIELDS = 8
NIL = -1
SCR_STAMP_LIMIT = 2**31 - 2

_u = np.uint64  # unsigned indices, as in flat: no wrap-around fix-up per index
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ZERO = np.uint64(0)
_ONE = np.uint64(1)
_HASH_SIGN = 2**63

_flat_fork = njit(inline="always")(flat.fork.py_func)
_flat_lookup = njit(inline="always")(flat.lookup.py_func)
_flat_last_slot = njit(inline="always")(flat.last_slot.py_func)
_flat_step = njit(inline="always")(flat.decode_step.py_func)


def layout(max_seqs: int, num_blocks: int, max_blocks_per_seq: int) -> tuple[int, int, int, int, int]:
    """``(ext, cap_bits, scr_bits, ints size, keys size)`` of a configuration."""
    ext = offsets(max_seqs, num_blocks)[-1]
    cap_bits = max(1, (2 * num_blocks - 1).bit_length())
    scr_bits = max(1, (2 * max_blocks_per_seq - 1).bit_length())
    cap, scr = 1 << cap_bits, 1 << scr_bits
    return ext, cap_bits, scr_bits, ext + FIELDS + cap + 2 * num_blocks + scr, cap + num_blocks + scr + 1


@njit(cache=True, inline="always")
def _ext(table, ints):
    """Where the cache extension starts in ``ints`` (flat's size, from the same formula as flat.offsets)."""
    return HEADER + ROW * table.shape[0] + 2 * np.int64(ints[NUM_BLOCKS]) + SAVED * table.shape[0]


@njit(cache=True, inline="always")
def _home(h, bits):
    """Fibonacci hashing: the top ``bits`` bits of ``h * 2**64/phi`` (1 <= bits <= 32, so the shift is < 64)."""
    return np.int64((h * _GOLDEN) >> np.uint64(64 - bits))


@njit(cache=True, inline="always")
def _find(ints, keys, ext, h):
    """The slot holding hash ``h`` (uint64, not 0), or -1. Load <= 1/2: the probe meets an empty slot."""
    bits = ints[ext + CAP_BITS]
    mask = (np.int64(1) << bits) - 1
    i = _home(h, bits)
    while True:
        k = keys[_u(i)]
        if k == h:
            return i
        if k == _ZERO:
            return NIL
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _insert(ints, keys, ext, h, block):
    """Give ``block`` hash ``h`` unless another block carries it; returns whether it did."""
    bits = ints[ext + CAP_BITS]
    mask = (np.int64(1) << bits) - 1
    vals = ext + FIELDS
    i = _home(h, bits)
    while True:
        k = keys[_u(i)]
        if k == _ZERO:
            break
        if k == h:
            return False
        i = (i + 1) & mask
    keys[_u(i)] = h
    ints[_u(vals + i)] = block
    keys[_u(mask + 1 + block)] = h
    ints[ext + CACHED] += 1
    return True


@njit(cache=True, inline="always")
def _delete(ints, keys, ext, i):
    """Empty slot ``i`` by backward shift, so no lookup ever needs a tombstone."""
    bits = ints[ext + CAP_BITS]
    mask = (np.int64(1) << bits) - 1
    vals = ext + FIELDS
    j = i
    while True:
        j = (j + 1) & mask
        k = keys[_u(j)]
        if k == _ZERO:
            break
        if ((j - _home(k, bits)) & mask) >= ((j - i) & mask):
            keys[_u(i)] = k
            ints[_u(vals + i)] = ints[_u(vals + j)]
            i = j
    keys[_u(i)] = _ZERO


@njit(cache=True, inline="always")
def _lru_push(ints, ext, prev, nxt, block):
    """``block`` (ref count now 0, cached) becomes the most recently freed evictable block."""
    tail = ints[ext + TAIL]
    ints[_u(prev + block)] = tail
    ints[_u(nxt + block)] = NIL
    if tail < 0:
        ints[ext + HEAD] = block
    else:
        ints[_u(nxt + tail)] = block
    ints[ext + TAIL] = block
    ints[ext + EVICT] += 1


@njit(cache=True, inline="always")
def _lru_unlink(ints, ext, prev, nxt, block):
    p, n = ints[_u(prev + block)], ints[_u(nxt + block)]
    if p < 0:
        ints[ext + HEAD] = n
    else:
        ints[_u(nxt + p)] = n
    if n < 0:
        ints[ext + TAIL] = p
    else:
        ints[_u(prev + n)] = p
    ints[ext + EVICT] -= 1


@njit(cache=True, inline="always")
def _take(ints, keys, ext, refs, stack):
    """A fresh block (ref 1): a never-cached one from the stack, else the least recently freed one, evicted."""
    top = ints[TOP]
    if top > 0:
        top -= 1
        ints[TOP] = top
        block = np.int64(ints[_u(stack + top)])
    else:
        nb = np.int64(ints[NUM_BLOCKS])
        cap = np.int64(1) << ints[ext + CAP_BITS]
        prev = ext + FIELDS + cap
        block = np.int64(ints[ext + HEAD])
        _lru_unlink(ints, ext, prev, prev + nb, block)
        _delete(ints, keys, ext, _find(ints, keys, ext, keys[_u(cap + block)]))
        keys[_u(cap + block)] = _ZERO
        ints[ext + CACHED] -= 1
        keys[keys.shape[0] - 1] += _ONE
    ints[_u(refs + block)] = 1
    return block


@njit(cache=True, inline="always")
def _free_count(ints, ext):
    return np.int64(ints[TOP]) + ints[ext + EVICT]


@njit(cache=True, inline="always")
def _take_row(table, ints, keys, ext, refs, stack, seq, need):
    for j in range(need):
        table[_u(seq), _u(j)] = _take(ints, keys, ext, refs, stack)
    return OK


@njit(cache=True, inline="always")
def _pool_context(ints, ext):
    cap = np.int64(1) << ints[ext + CAP_BITS]
    prev = ext + FIELDS + cap
    return cap, prev, prev + ints[NUM_BLOCKS]


@njit(cache=True, inline="always")
def _give_back(ints, keys, ext, context, stack, top, block):
    """A freed block that carries a hash becomes evictable (the LRU's newest); any other goes on the stack."""
    cap, prev, nxt = context
    if keys[_u(cap + block)] != _ZERO:
        _lru_push(ints, ext, prev, nxt, block)
        return top
    ints[_u(stack + top)] = block
    return top + 1


@njit(cache=True, inline="always")
def _short_by(ints, ext, need):
    ints[ext + DETAIL] = need


_POOL = {"_extension": _ext, "_free_count": _free_count, "_take": _take, "_take_row": _take_row,
         "_pool_context": _pool_context, "_give_back": _give_back, "_short_by": _short_by}
_flat_allocate = njit(inline="always")(specialise(flat.allocate_row.py_func, "flat_pc", **_POOL))
_flat_append = njit(inline="always")(specialise(flat.append_token.py_func, "flat_pc", **_POOL))
_flat_free = njit(inline="always")(specialise(flat.release_row.py_func, "flat_pc", **_POOL))


@njit(cache=True)
def can_allocate(table, ints, keys, n):
    if n < 0:
        return E_COUNT
    return 1 if _free_count(ints, _ext(table, ints)) >= n else 0


@njit(cache=True)
def allocate(table, ints, keys, seq, num_tokens):
    return _flat_allocate(table, ints, keys, seq, num_tokens)


@njit(cache=True)
def append(table, ints, keys, seq):
    return _flat_append(table, ints, keys, seq)


@njit(cache=True)
def fork(table, ints, keys, parent, child):
    return _flat_fork(table, ints, parent, child)


@njit(cache=True)
def free(table, ints, keys, seq):
    return _flat_free(table, ints, keys, seq)


@njit(cache=True)
def last_slot(table, ints, keys, seq):
    return _flat_last_slot(table, ints, seq)


@njit(cache=True)
def lookup(table, ints, keys, seq_ids, slot_out):
    return _flat_lookup(table, ints, seq_ids, slot_out)


@njit(cache=True)
def decode_step(table, ints, keys, seq_ids, cow_out, slot_out):
    n = seq_ids.shape[0]
    if n <= ints[TOP]:
        return _flat_step(table, ints, seq_ids, cow_out, slot_out)
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    ext = _ext(table, ints)
    rc, need = flat.reserve(table, ints, seq_ids)  # validates every id (marks only), then the need vs the stack
    if rc == E_NO_BLOCKS:
        if need > _free_count(ints, ext):
            return E_NO_BLOCKS, need
    elif rc != OK:
        return rc, need
    return _tight_appends(table, ints, keys, ext, seq_ids, cow_out, slot_out)


@njit(cache=True, inline="always")
def _tight_appends(table, ints, keys, ext, seq_ids, cow_out, slot_out):
    """The appends of a validated step whose need the stack and the LRU cover: nothing can fail here."""
    sh = ints[BLOCK_SHIFT]
    mask = (1 << sh) - 1
    refs = HEADER + ROW * table.shape[0]
    stack = refs + ints[NUM_BLOCKS]
    cows = 0
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[_u(i)]
        rec = HEADER + ROW * seq
        length = ints[_u(rec + LEN)]
        off = length & mask
        j = _u(length >> sh)
        if off == 0:
            block = _take(ints, keys, ext, refs, stack)
            table[_u(seq), j] = block
        else:
            block = np.int64(table[_u(seq), j])
            if ints[_u(rec + MARK)] & SHARED and ints[_u(refs + block)] != 1:
                dst = _take(ints, keys, ext, refs, stack)
                ints[_u(refs + block)] -= 1
                table[_u(seq), j] = dst
                cow_out[_u(cows), 0] = block
                cow_out[_u(cows), 1] = dst
                cows += 1
                block = dst
        ints[_u(rec + MARK)] &= ~SHARED
        ints[_u(rec + LEN)] = length + 1
        slot_out[_u(i)] = (block << sh) | off
        store(ints, rec + NEXT, ((block << sh) | off) + 1)  # flat's NEXT: the block is the row's own now
    return cows, 0


@njit(cache=True, inline="always")
def _next_scratch_stamp(ints, ext):
    """A stamp no scratch slot holds: slots are cleared only when it wraps."""
    stamp = ints[ext + SCR_STAMP] + 1
    if stamp > SCR_STAMP_LIMIT:
        at = ext + FIELDS + (np.int64(1) << ints[ext + CAP_BITS]) + 2 * np.int64(ints[NUM_BLOCKS])
        for s in range(np.int64(1) << ints[ext + SCR_BITS]):
            ints[_u(at + s)] = 0
        stamp = 1
    ints[ext + SCR_STAMP] = stamp
    return stamp


@njit(cache=True, inline="always")
def _seen_before(ints, keys, ext, stamp, h):
    """Add ``h`` to the call's scratch set; True if it was there (the chain holds it twice)."""
    nb = np.int64(ints[NUM_BLOCKS])
    cap = np.int64(1) << ints[ext + CAP_BITS]
    bits = ints[ext + SCR_BITS]
    mask = (np.int64(1) << bits) - 1
    stamps = ext + FIELDS + cap + 2 * nb
    at = cap + nb
    s = _home(h, bits)
    while ints[_u(stamps + s)] == stamp:
        if keys[_u(at + s)] == h:
            return True
        s = (s + 1) & mask
    ints[_u(stamps + s)] = stamp
    keys[_u(at + s)] = h
    return False


@njit(cache=True, inline="always")
def _check_chain(table, ints, keys, ext, seq, chain, write):
    """Check a chain's entries (non-zero, distinct) and find its cached prefix: ``(code, hits, evictable hits)``."""
    stamp = _next_scratch_stamp(ints, ext)
    refs = HEADER + ROW * table.shape[0]
    vals = ext + FIELDS
    hits, evictable, missed = 0, 0, False
    for i in range(chain.shape[0]):
        h = chain[_u(i)]
        if h == _ZERO or _seen_before(ints, keys, ext, stamp, h):
            ints[ext + DETAIL] = i
            return E_HASH, 0, 0
        if not missed:
            slot = _find(ints, keys, ext, h)
            if slot < 0:
                missed = True
            else:
                block = ints[_u(vals + slot)]
                if write:
                    table[_u(seq), _u(i)] = block
                hits += 1
                evictable += ints[_u(refs + block)] == 0
    return OK, hits, evictable


@njit(cache=True)
def allocate_cached(table, ints, keys, seq, num_tokens, chain):
    """Admission with the prefix cache; returns the tokens served from the cache, or a code (<0)."""
    ext = _ext(table, ints)
    sh = ints[BLOCK_SHIFT]
    rc, blocks = flat.fits(table.shape[0], table.shape[1], sh, seq, num_tokens)
    if rc != OK:
        return rc
    full = num_tokens >> sh
    if chain.shape[0] != full:
        ints[ext + DETAIL] = -1
        return E_HASH
    rec = HEADER + ROW * seq
    active = ints[_u(rec + LEN)] != 0
    rc, hits, evictable = _check_chain(table, ints, keys, ext, seq, chain, not active)
    if rc != OK:
        return rc
    if active:
        return E_ACTIVE
    need = blocks - hits + evictable
    if need > _free_count(ints, ext):
        ints[ext + DETAIL] = need
        return E_NO_BLOCKS
    _admit(table, ints, keys, ext, seq, chain, hits, blocks)
    ints[_u(rec + LEN)] = num_tokens
    mark = ints[_u(rec + MARK)] & ~SHARED
    ints[_u(rec + MARK)] = mark | SHARED if hits == blocks and hits > 0 else mark
    return np.int64(hits) << sh


@njit(cache=True, inline="always")
def _admit(table, ints, keys, ext, seq, chain, hits, blocks):
    """The row's blocks once the pool covers them, in the contract's order."""
    refs = HEADER + ROW * table.shape[0]
    stack = refs + ints[NUM_BLOCKS]
    prev = ext + FIELDS + (np.int64(1) << ints[ext + CAP_BITS])
    nxt = prev + ints[NUM_BLOCKS]
    for j in range(hits):  # (1) the hits, in chain order (_check_chain wrote them to the row)
        block = np.int64(table[_u(seq), _u(j)])
        if ints[_u(refs + block)] == 0:
            _lru_unlink(ints, ext, prev, nxt, block)
        ints[_u(refs + block)] += 1
    for j in range(hits, blocks):  # (2) the fresh blocks, each take may evict
        table[_u(seq), _u(j)] = _take(ints, keys, ext, refs, stack)
    for j in range(hits, chain.shape[0]):  # (3) the fresh full blocks' hashes, unless another block carries one
        _insert(ints, keys, ext, chain[_u(j)], np.int64(table[_u(seq), _u(j)]))


@njit(cache=True)
def seal(table, ints, keys, seq, block_hash):
    """Give the row's full last block the hash ``block_hash`` (any 64-bit integer type; its bits are the hash)."""
    h = np.uint64(block_hash)
    if _u(seq) >= _u(table.shape[0]):
        return E_SEQ_RANGE
    n = ints[_u(HEADER + ROW * seq + LEN)]
    if n == 0:
        return E_INACTIVE
    if h == _ZERO:
        return E_HASH
    sh = ints[BLOCK_SHIFT]
    if n & ((1 << sh) - 1):
        return E_NOT_FULL
    ext = _ext(table, ints)
    block = np.int64(table[_u(seq), _u((n >> sh) - 1)])
    if keys[_u((np.int64(1) << ints[ext + CAP_BITS]) + block)] != _ZERO:
        return E_SEALED
    return 1 if _insert(ints, keys, ext, h, block) else 0


KERNELS = CachingKernels(can_allocate, allocate, append, fork, free, decode_step, lookup, last_slot,
                         allocate_cached, seal)


class FlatPcBlockManager(FlatBlockManager):
    """``flat`` with prefix caching (``"flat-pc"``): open-addressing hash table and intrusive LRU in arrays."""

    prefix_caching = True
    kernels = KERNELS

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256, *, table: np.ndarray | None = None) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq, table=table)
        ext, cap_bits, scr_bits, _, key_size = layout(self.max_seqs, self.num_blocks, self.max_blocks_per_seq)
        ints = self.ints
        ints[ext + HEAD] = ints[ext + TAIL] = NIL
        ints[ext + CAP_BITS], ints[ext + SCR_BITS] = cap_bits, scr_bits
        self.keys = resident_zeros(key_size, np.uint64)
        self._ext, self._cap = ext, 1 << cap_bits
        self.state = (self.table, self.ints, self.keys)

    def _ints_size(self) -> int:
        return layout(self.max_seqs, self.num_blocks, self.max_blocks_per_seq)[3]

    def memory_bytes(self) -> int:
        _, _, _, size, key_size = layout(self.max_seqs, self.num_blocks, self.max_blocks_per_seq)
        return super().memory_bytes() + 4 * (size - offsets(self.max_seqs, self.num_blocks)[-1]) + 8 * key_size

    def num_free_blocks(self) -> int:
        """Never-cached free blocks plus evictable ones."""
        return int(self.ints[TOP]) + int(self.ints[self._ext + EVICT])

    def num_cached_blocks(self) -> int:
        return int(self.ints[self._ext + CACHED])

    @property
    def evictions(self) -> int:
        """Blocks evicted so far (a statistic, as ``ReferenceModel.evictions``)."""
        return int(self.keys[-1])

    def home_slot(self, block_hash: int) -> int:
        """The hash table slot where ``block_hash``'s probe starts."""
        bits = int(self.ints[self._ext + CAP_BITS])
        return (int(block_hash) * int(_GOLDEN) % 2**64) >> (64 - bits)

    def slot_keys(self) -> list[int]:
        """The hash table's slots in order: the hash each holds, 0 for an empty slot."""
        return [int(k) for k in self.keys[: self._cap]]

    def cache_state(self) -> dict:
        """The cache's state: hash -> block, block -> hash, and the LRU from least to most recently freed."""
        ext, cap, n = self._ext, self._cap, self.num_blocks
        keys, ints = self.keys, self.ints
        table = {int(keys[i]): int(ints[ext + FIELDS + i]) for i in range(cap) if keys[i]}
        carried = {b: int(keys[cap + b]) for b in range(n) if keys[cap + b]}
        prev, nxt = ext + FIELDS + cap, ext + FIELDS + cap + n
        lru, b = [], int(ints[ext + HEAD])
        while b >= 0:
            if len(lru) > n:
                raise AssertionError("the LRU has a cycle")
            lru.append(b)
            if ints[nxt + b] >= 0 and ints[prev + ints[nxt + b]] != b:
                raise AssertionError(f"the LRU links of block {b} disagree")
            b = int(ints[nxt + b])
        if lru[-1:] != ([int(ints[ext + TAIL])] if lru else []):
            raise AssertionError("the LRU's tail is not its last block")
        return {"table": table, "carried": carried, "lru": lru}

    def check_invariants(self) -> None:
        """``flat``'s invariants, then the cache's: table and hashes agree, probe runs unbroken, LRU = ref 0."""
        super().check_invariants()
        state = self.cache_state()
        if state["table"] != {h: b for b, h in state["carried"].items()}:
            raise AssertionError("the hash table and the blocks' hashes disagree")
        if self.num_cached_blocks() != len(state["carried"]):
            raise AssertionError("the cached-block count is not the number of blocks carrying a hash")
        mask = self._cap - 1
        for i in range(self._cap):
            j = self.home_slot(int(self.keys[i])) if self.keys[i] else i
            while j != i:
                if not self.keys[j]:
                    raise AssertionError(f"slot {i} is unreachable from its home slot")
                j = (j + 1) & mask
        evictable = [b for b in state["carried"] if self._refs[b] == 0]
        if sorted(state["lru"]) != sorted(evictable):
            raise AssertionError("the LRU is not exactly the cached blocks with ref count 0")
        if self.num_free_blocks() != int(self.ints[TOP]) + len(evictable):
            raise AssertionError("the free count is not the free stack plus the evictable blocks")

    def _check_free(self, held: dict[int, int]) -> None:
        """The free stack holds never-cached unheld blocks; the cached unheld ones are evictable instead."""
        stack, carried = self.free_stack(), self.cache_state()["carried"]
        unheld = set(range(self.num_blocks)) - set(held)
        if len(set(stack)) != len(stack) or set(stack) != unheld - set(carried):
            raise AssertionError("the free stack is not exactly the never-cached blocks no row holds")

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int:
        """Admit a request through the prefix cache; returns the prompt tokens served from the cache."""
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        if type(num_tokens) is not int or not 0 < num_tokens <= self.max_tokens:
            num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        chain = chain_shape_arg(hashes, num_tokens, self.block_shift, seq_id)
        rc = self.kernels.allocate_cached(*self.state, seq_id, num_tokens, chain)
        if rc < 0:
            detail = int(self.ints[self._ext + DETAIL])
            self._fail(rc, seq_id, num_tokens=num_tokens, need=detail, why=chain_problem(chain))
        return rc

    def seal(self, seq_id: int, block_hash: int) -> bool:
        """Give the sequence's full last block its hash; False when another block already carries it."""
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        h = block_hash
        if type(h) is not int or not 0 < h < _HASH_SIGN:
            self._active(seq_id)
            h = hash_arg(block_hash, seq_id)
            h = h - 2**64 if h >= _HASH_SIGN else h
        rc = self.kernels.seal(*self.state, seq_id, h)
        if rc < 0:
            self._fail(rc, seq_id, why="block hash 0 is reserved")
        return rc == 1

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        seq_ids = lookup_args(seq_ids, slot_out, self.max_seqs)
        rc, detail = flat.lookup(self.table, self.ints, seq_ids, slot_out)
        if rc < 0:
            self._fail_batch(rc, detail, seq_ids, len(slot_out))
