"""``flat-pc`` (:mod:`impls.caching.flat_pc`): the caching rules by hand, its hash table under churn, a random-program
differential test against :class:`impls.core.reference.ReferenceModel`, zero allocations per step with caching on,
and the compiled replay of a caching program."""

from __future__ import annotations

import numpy as np
import pytest

from harness.conformance.idmap import IdMap
from impls.caching.flat_pc import FlatPcBlockManager
from impls.contract import E_HASH, NoFreeBlocksError
from impls.core.reference import ReferenceModel
from impls.designs.flat import FlatBlockManager


def H(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def observable(mgr: FlatPcBlockManager) -> tuple:
    """Everything a later call can see: lengths, ref counts, the stack, live rows, the cache (not the scratch
    set, the failure detail or the entries of inactive rows, which nothing reads)."""
    rows = [mgr.block_table(s) if _active(mgr, s) else [] for s in range(mgr.max_seqs)]
    refs = [mgr.ref_count(b) for b in range(mgr.num_blocks)]
    return (rows, refs, mgr.free_stack(), mgr.cache_state(), mgr.num_cached_blocks(), mgr.evictions,
            mgr.num_free_blocks())


def _active(mgr: FlatPcBlockManager, seq: int) -> bool:
    try:
        return mgr.seq_len(seq) > 0
    except KeyError:
        return False


def check_invariants(mgr: FlatPcBlockManager) -> None:
    mgr.check_invariants()


# -- the caching rules, by hand --------------------------------------------------------------------------------
def test_full_hit_partial_hit_and_miss() -> None:
    m = FlatPcBlockManager(16, 4, 4, 8)
    assert m.allocate_cached(0, 10, H(1, 2)) == 0  # miss: 3 fresh blocks, the 2 full ones cached
    assert m.num_cached_blocks() == 2 and m.num_free_blocks() == 13
    a = m.block_table(0)
    assert m.allocate_cached(1, 8, H(1, 2)) == 8  # full hit: no block taken
    assert m.block_table(1) == a[:2] and m.ref_count(a[0]) == m.ref_count(a[1]) == 2
    assert m.num_free_blocks() == 13
    assert m.allocate_cached(2, 13, H(1, 5, 2)) == 4  # partial hit: after the first miss, no more hits
    t = m.block_table(2)
    assert t[0] == a[0] and a[1] not in t[1:] and m.num_cached_blocks() == 3  # 5 inserted, 2 kept by a[1]
    assert m.ref_count(a[1]) == 2 and m.num_free_blocks() == 10
    check_invariants(m)


def test_eviction_order_least_recently_freed_tail_before_head() -> None:
    m = FlatPcBlockManager(4, 4, 4, 8)
    m.allocate_cached(0, 8, H(1, 2))
    m.allocate_cached(1, 8, H(3, 4))
    b0, b1 = m.block_table(0), m.block_table(1)
    m.free(1)  # freed first: evicted first, its tail (4) before its head (3)
    m.free(0)
    assert m.num_free_blocks() == 4 and m.num_cached_blocks() == 4
    assert m.cache_state()["lru"] == [b1[1], b1[0], b0[1], b0[0]]
    m.allocate(2, 1)  # the stack is empty: evicts hash 4's block
    assert m.block_table(2) == [b1[1]] and m.num_cached_blocks() == 3 and m.evictions == 1
    assert m.allocate_cached(3, 8, H(3, 4)) == 4  # 3 still cached, 4 gone: one hit, one fresh block
    assert m.block_table(3) == [b1[0], b0[1]]  # the fresh one evicted the next least recently freed (hash 2)
    assert m.evictions == 2 and m.num_cached_blocks() == 3  # 1 and 3 stay, 4 is now carried by b0[1]
    with pytest.raises(NoFreeBlocksError, match="need 2"):  # 1 hits but is evictable: it counts, + 1 fresh
        m.allocate_cached(0, 8, H(1, 2))
    check_invariants(m)


def test_hit_on_evictable_block_leaves_the_lru() -> None:
    m = FlatPcBlockManager(4, 4, 4, 8)
    m.allocate_cached(0, 8, H(1, 2))
    blocks = m.block_table(0)
    m.free(0)
    assert m.cache_state()["lru"] == [blocks[1], blocks[0]] and m.num_free_blocks() == 4
    assert m.allocate_cached(1, 4, H(1)) == 4
    assert m.cache_state()["lru"] == [blocks[1]] and m.ref_count(blocks[0]) == 1 and m.num_free_blocks() == 3
    m.allocate(2, 12)  # the two never-cached blocks, then the evictable one: never the hit
    assert m.block_table(1) == [blocks[0]] and blocks[1] in m.block_table(2) and m.num_cached_blocks() == 1
    check_invariants(m)


def test_fork_shares_cached_blocks() -> None:
    m = FlatPcBlockManager(8, 4, 4, 8)
    m.allocate_cached(0, 8, H(1, 2))
    m.fork(0, 1)
    blocks = m.block_table(0)
    assert m.block_table(1) == blocks and [m.ref_count(b) for b in blocks] == [2, 2]
    m.free(0)
    assert m.num_cached_blocks() == 2 and m.cache_state()["lru"] == []
    m.free(1)
    assert m.cache_state()["lru"] == [blocks[1], blocks[0]]
    assert m.allocate_cached(2, 9, H(1, 2)) == 8
    check_invariants(m)


def test_seal_and_its_errors() -> None:
    m = FlatPcBlockManager(8, 4, 4, 8)
    m.allocate(0, 3)
    with pytest.raises(KeyError):
        m.seal(1, 5)
    with pytest.raises(ValueError, match="not full"):
        m.seal(0, 5)
    m.append_slot(0)
    for bad in (0, -1, 2**64, True, 1.0, "7", np.uint64(0)):
        with pytest.raises(ValueError, match="hash"):
            m.seal(0, bad)
    with pytest.raises(KeyError):  # the row's state before the hash
        m.seal(2, 0)
    with pytest.raises(ValueError, match="outside"):
        m.seal(9, 5)
    assert m.seal(0, 2**64 - 1) is True and m.num_cached_blocks() == 1
    with pytest.raises(ValueError, match="already"):
        m.seal(0, 6)
    m.allocate(1, 4)
    assert m.seal(1, np.uint64(2**64 - 1)) is False and m.num_cached_blocks() == 1  # another block carries it
    assert m.seal(1, np.int64(7)) is True
    assert m.allocate_cached(2, 8, H(2**64 - 1, 7)) == 8
    check_invariants(m)


@pytest.mark.parametrize("hashes, why", [
    (H(1, 0), "entry 1 is 0"), (H(3, 3), "twice"), (H(1), "1 hashes for 2"), (H(1, 2, 3), "3 hashes"),
    (np.array([1, 2], dtype=np.int64), "dtype"), ([1, 2], "ndarray"), (H(1, 2, 3, 4)[::2], "contiguous"),
    (H(1, 2).reshape(1, 2), "1-D"),
])
def test_invalid_chains_change_nothing(hashes, why) -> None:
    m = FlatPcBlockManager(8, 4, 4, 8)
    m.allocate_cached(0, 8, H(3, 9))
    before = observable(m)
    for seq in (1, 0):  # an inactive row, and an active one: the chain is checked before the row's state
        with pytest.raises(ValueError, match=why):
            m.allocate_cached(seq, 9, hashes)
    assert observable(m) == before
    assert m.kernels.allocate_cached(*m.state, 1, 9, H(1)) == E_HASH  # the kernel checks the length itself


def test_argument_order() -> None:
    m = FlatPcBlockManager(8, 4, 4, 2)
    with pytest.raises(ValueError, match="outside"):
        m.allocate_cached(4, 0, "x")
    with pytest.raises(ValueError, match="num_tokens"):
        m.allocate_cached(0, 0, "x")
    with pytest.raises(ValueError, match="max_blocks_per_seq"):
        m.allocate_cached(0, 9, "x")
    with pytest.raises(TypeError):
        m.allocate_cached(True, 4, H(1))
    m.allocate(0, 1)
    with pytest.raises(KeyError):
        m.allocate_cached(0, 4, H(1))


def test_no_free_blocks_is_atomic() -> None:
    m = FlatPcBlockManager(4, 4, 4, 8)
    m.allocate_cached(0, 8, H(1, 2))
    m.free(0)
    m.allocate_cached(1, 4, H(5))  # a never-cached block first, then... the stack still has one
    state = observable(m)
    # hits 1 and 2 (both evictable: they count) plus 2 fresh blocks: 4 > 3 free
    with pytest.raises(NoFreeBlocksError, match="need 4"):
        m.allocate_cached(2, 13, H(1, 2, 7))
    with pytest.raises(NoFreeBlocksError):
        m.allocate(2, 13)
    assert observable(m) == state
    assert m.allocate_cached(2, 12, H(1, 2, 7)) == 8  # 2 evictable hits + 1 fresh = 3: fits exactly
    assert m.num_free_blocks() == 0
    check_invariants(m)


def test_decode_step_evicts_in_a_tight_pool_and_counts_evictable_blocks() -> None:
    m = FlatPcBlockManager(6, 4, 4, 8)
    m.allocate_cached(0, 8, H(1, 2))
    m.allocate_cached(1, 8, H(3, 4))
    m.allocate(2, 4)
    m.allocate(3, 4)
    first = m.block_table(0)
    m.free(0)  # stack empty, 2 evictable
    ids, cow, slot = np.array([1, 2, 3], np.int64), np.zeros((3, 2), np.int64), np.zeros(3, np.int64)
    with pytest.raises(NoFreeBlocksError):
        m.decode_step(ids, cow, slot)  # 3 boundaries, 2 free
    assert m.num_free_blocks() == 2 and m.num_cached_blocks() == 4
    assert m.decode_step(ids[:2], cow, slot) == 0
    assert [m.block_table(1)[-1], m.block_table(2)[-1]] == [first[1], first[0]]  # tail first
    assert m.num_cached_blocks() == 2 and m.evictions == 2 and m.num_free_blocks() == 0
    assert slot[:2].tolist() == [first[1] * 4, first[0] * 4]
    check_invariants(m)


def test_cow_after_fork_in_a_tight_pool() -> None:
    m = FlatPcBlockManager(3, 4, 4, 8)
    m.allocate_cached(0, 4, H(1))
    m.free(0)  # one evictable block, two never-cached
    m.allocate(1, 2)
    m.fork(1, 2)
    m.allocate(3, 1)  # stack empty now
    ids, cow, slot = np.array([1, 2], np.int64), np.zeros((2, 2), np.int64), np.zeros(2, np.int64)
    with pytest.raises(NoFreeBlocksError, match="need 2"):  # the worst case: both rows' blocks are shared
        m.decode_step(ids, cow, slot)
    assert m.decode_step(ids[:1], cow, slot) == 1  # row 1 copies, evicting the cached block
    assert m.evictions == 1 and m.num_cached_blocks() == 0 and cow[0, 1] == m.block_table(1)[0]
    check_invariants(m)


def test_hash_table_churn_wraps_and_deletes_mid_chain() -> None:
    """Many insert/evict cycles in a table of 16 slots: hashes chosen to share home slots near the table's
    end (so probe runs wrap around) and evicted in an order that deletes from the middle of runs."""
    m = FlatPcBlockManager(8, 1, 8, 8)
    home = m.home_slot
    assert len(m.slot_keys()) == 16

    near_end = [h for h in range(1, 5000) if home(h) >= 14][:400]
    rng = np.random.default_rng(5)
    wrapped = mid_chain = 0
    for _ in range(120):
        chosen = rng.choice(near_end, size=8, replace=False)
        for seq in range(8):
            m.allocate_cached(seq, 1, H(int(chosen[seq])))
        keys = m.slot_keys()
        slots = [i for i in range(16) if keys[i]]
        wrapped += any(i < 8 and home(keys[i]) >= 14 for i in slots)
        for seq in rng.permutation(8):
            m.free(int(seq))
        check_invariants(m)
        before = m.slot_keys()
        m.allocate(0, int(rng.integers(1, 9)))  # evicts the LRU's first blocks, wherever their slots are
        check_invariants(m)
        gone = [i for i in range(16) if before[i] and int(before[i]) not in m.cache_state()["table"]]
        mid_chain += sum(bool(before[(i + 1) % 16]) for i in gone)  # a key followed it in its run
        m.free(0)
        for h in chosen:  # whatever survived is still found where it is
            b = m.cache_state()["table"].get(int(h))
            assert b is None or m.cache_state()["carried"][b] == int(h)
    assert wrapped > 50 and mid_chain > 100


# -- differential test against the reference model -------------------------------------------------------------
class Pair:
    """The reference model and flat-pc side by side, compared after every call up to renaming of ids."""

    def __init__(self, num_blocks: int, bs: int, rows: int, cols: int) -> None:
        self.model = ReferenceModel(num_blocks, bs, rows, cols)
        self.mgr = FlatPcBlockManager(num_blocks, bs, rows, cols)
        self.ids = IdMap()

    def call(self, name: str, *args):
        results = []
        for target in (self.model, self.mgr):
            try:
                results.append((getattr(target, name)(*args), None))
            except (ValueError, KeyError, TypeError, MemoryError) as exc:
                results.append((None, type(exc)))
        (want, want_exc), (got, got_exc) = results
        assert got_exc is want_exc, f"{name}{args}: {got_exc} vs model {want_exc}"
        return want, got

    def same(self) -> None:
        model, mgr, ids = self.model, self.mgr, self.ids
        for m in [m for m in ids.to_impl if model.refs[m] == 0 and m not in model.block_hash]:
            del ids.to_model[ids.to_impl.pop(m)]  # never-cached free blocks may be renamed; cached ones may not
        assert mgr.num_free_blocks() == model.num_free_blocks()
        assert mgr.num_cached_blocks() == model.num_cached_blocks() and mgr.evictions == model.evictions
        for seq in range(model.max_seqs):
            active = seq in model.tables
            assert (mgr._lens[seq] != 0) == active
            if active:
                assert mgr.seq_len(seq) == model.lens[seq]
                for a, b in zip(model.tables[seq], mgr.block_table(seq), strict=True):
                    ids.bind(a, b)
        carried = mgr.cache_state()["carried"]
        for m, i in ids.to_impl.items():
            assert mgr.ref_count(i) == model.refs[m]
            assert carried.get(i) == model.block_hash.get(m), f"block {m}/{i}: hash differs"
        lru = mgr.cache_state()["lru"]
        assert len(lru) == len(model.evictable)
        for m, i in zip(model.evictable, lru, strict=True):
            ids.bind(m, i)


def _chain(rng, universe: int, tokens: int, bs: int) -> np.ndarray:
    """A prompt's chain: a prefix of one of a few documents (so prefixes are shared), sometimes invalid."""
    k = tokens // bs
    doc = int(rng.integers(0, 3))
    chain = [1 + (doc * 7 + i * 3 + int(rng.random() < 0.15) * int(rng.integers(1, 5))) % universe
             for i in range(k)]
    if len(set(chain)) != len(chain) and rng.random() < 0.8:
        chain = list(dict.fromkeys(chain))
        chain += [c for c in range(1, universe + 2 * k) if c not in chain][: k - len(chain)]
    r = rng.random()
    if r < 0.03 and k:
        chain[int(rng.integers(0, k))] = 0
    elif r < 0.05:
        chain.append(1)
    return np.array(chain, dtype=np.uint64)


def _random_op(pair: Pair, rng, bs: int, universe: int) -> None:
    rows, cols = pair.model.max_seqs, pair.model.max_blocks_per_seq
    r = rng.random()
    seq = _pick_row(pair, rng, active=r >= 0.36)
    if r < 0.3:
        tokens = int(rng.integers(1, cols * bs + 2)) if rng.random() < 0.1 else int(rng.integers(1, 3 * bs + 1))
        want, got = pair.call("allocate_cached", seq, tokens, _chain(rng, universe, tokens, bs))
        assert want == got
    elif r < 0.36:
        pair.call("allocate", seq, int(rng.integers(1, cols * bs + 1)))
    elif r < 0.5:
        want, got = pair.call("append_slot", seq)
        if want is not None:
            assert got is not None
            pair.ids.bind(want[0], got[0])
            pair.ids.bind(want[1], got[1])
        else:
            assert got is None
    elif r < 0.62:
        h = int(rng.integers(0, universe + 1)) if rng.random() < 0.9 else 2**64 - 1
        want, got = pair.call("seal", seq, h)
        assert want == got
    elif r < 0.7:
        pair.call("fork", seq, int(rng.integers(0, rows)))
    elif r < 0.85:
        pair.call("free", seq)
    elif r < 0.9:
        n = int(rng.integers(0, pair.model.num_blocks + 2))
        want, got = pair.call("can_allocate", n)
        assert want == got
    else:
        _random_step(pair, rng)


def _pick_row(pair: Pair, rng, active: bool) -> int:
    """Mostly a row in the state the operation wants (active or not), sometimes any id, in range or not."""
    rows = pair.model.max_seqs
    wanted = [s for s in range(rows) if (s in pair.model.tables) == active]
    if wanted and rng.random() < 0.85:
        return int(rng.choice(wanted))
    return int(rng.integers(-1, rows + 1)) if rng.random() < 0.2 else int(rng.integers(0, rows))


def _random_step(pair: Pair, rng) -> None:
    rows = pair.model.max_seqs
    active = sorted(pair.model.tables)
    ids = list(rng.permutation(active)[: int(rng.integers(0, len(active) + 1))]) if active else []
    if rng.random() < 0.1:
        ids.insert(0, int(rng.integers(0, rows)))
    ids = np.array(ids, dtype=np.int64)
    cow, slot = np.full((len(ids), 2), -7, np.int64), np.full(len(ids), -7, np.int64)
    model_free = pair.model.num_free_blocks()
    try:
        cows, slots = pair.model.decode_step(ids.tolist())
        want_exc = None
    except (ValueError, KeyError, MemoryError) as exc:
        want_exc = type(exc)
    try:
        n = pair.mgr.decode_step(ids, cow, slot)
        got_exc = None
    except (ValueError, KeyError, MemoryError) as exc:
        got_exc = type(exc)
    assert got_exc is want_exc
    if want_exc is None:
        assert n == len(cows)
        for (a, b), (c, d) in zip(cows, cow[:n].tolist(), strict=True):
            pair.ids.bind(a, c)
            pair.ids.bind(b, d)
        for a, b in zip(slots, slot.tolist(), strict=True):
            pair.ids.slot(a, b, pair.model.block_size)
    else:
        assert (slot == -7).all() and (cow == -7).all() and pair.mgr.num_free_blocks() == model_free


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_match_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bs = [1, 2, 4][seed % 3]
    pair = Pair(int(rng.integers(3, 10)), bs, 5, 6)
    universe = 12
    for _ in range(400):
        _random_op(pair, rng, bs, universe)
        pair.same()
    check_invariants(pair.mgr)
    assert pair.model.evictions > 0 and pair.model.num_cached_blocks() >= 0


# -- rule 1 with caching on ------------------------------------------------------------------------------------
K = 200


def evicting_manager(seqs: int = 64):
    """64 running rows in a pool whose never-cached stack is empty and whose free blocks are all evictable
    (cached, ref 0): every block a decode step takes is an eviction from the hash table and the LRU."""
    lens = [1 + 7 * seq for seq in range(seqs)]
    spare = 8 * 128
    mgr = FlatPcBlockManager(sum(-(-n // 16) for n in lens) + spare, 16, seqs + 1, 128)
    for seq, n in enumerate(lens):
        mgr.allocate(seq, n)
    for k in range(8):
        mgr.allocate_cached(seqs, 128 * 16, np.arange(1 + 128 * k, 1 + 128 * (k + 1), dtype=np.uint64))
        mgr.free(seqs)
    assert mgr.num_free_blocks() == spare == mgr.num_cached_blocks() and not mgr.free_stack()
    ids = np.arange(seqs, dtype=np.int64)
    cow, slot = np.zeros((seqs, 2), np.int64), np.zeros(seqs, np.int64)
    empty = ids[:0]  # made once: a slice per call would be an allocation of the baseline's own

    def step():
        mgr.decode_step(ids, cow, slot)

    def empty_step():
        mgr.decode_step(empty, cow, slot)

    for _ in range(3):
        step(), empty_step()
    return mgr, step, empty_step


@pytest.mark.parametrize("counter", ["memray", "nrt"])
def test_evicting_step_allocates_nothing_beyond_the_call(counter) -> None:
    from harness.counters.allocations import count_allocations, nrt_allocations

    count = count_allocations if counter == "memray" else nrt_allocations
    mgr, step, empty_step = evicting_manager()
    count(step, 2), count(empty_step, 2)
    before = mgr.evictions
    assert count(step, K) == count(empty_step, K)
    assert mgr.evictions - before > 500  # the counted steps did evict (about one block per row per 16 steps)


def test_per_call_caching_operations_allocate_only_their_wrappers() -> None:
    from harness.counters.allocations import nrt_allocations

    mgr = FlatPcBlockManager(12, 4, 4, 8)
    for seq in range(3):  # a tight pool: 3 rows of 3 blocks, 3 evictable blocks, an empty stack
        mgr.allocate(seq, 12)
    mgr.allocate_cached(3, 12, H(1, 2, 3))
    mgr.free(3)
    chain = H(1, 2)
    start = mgr.evictions

    def churn():
        mgr.allocate_cached(3, 11, chain)  # hits 1 and 2 (evictable), a third block from the LRU: evicts
        mgr.append_slot(3)  # fills the block
        mgr.seal(3, 99)
        mgr.free(3)

    churn()
    assert nrt_allocations(churn, K) == (4 + 3 + 3 + 3) * K  # table, ints, keys (+ chain) per call, no more
    assert mgr.evictions - start == K + 1 and mgr.num_cached_blocks() == 3


# -- the compiled replay of a caching program ------------------------------------------------------------------
def caching_program(seed: int, steps: int = 60):
    """A random caching workload run on the reference model: trace arrays in the replay's layout, the hash
    pool, and the expected hit tokens and copy-on-writes per step."""
    from scenarios.trace import APPEND

    rng = np.random.default_rng(seed)
    bs, rows, cols = 4, 6, 8
    model = ReferenceModel(20, bs, rows, cols)
    op, a0, a1, op_hash, pool, seq_ids = [], [], [], [], [], []
    step_offsets, decode_offsets, hits, cows = [], [], [], []

    def emit(o, x, y, h=0):
        op.append(o), a0.append(x), a1.append(y), op_hash.append(h), seq_ids.append(x)

    for _ in range(steps):
        step_offsets.append(len(op))
        got = sum(_pool_op(model, rng, emit, pool) for _ in range(int(rng.integers(0, 4))))
        decode_offsets.append(len(op))
        running = [s for s in sorted(model.tables) if model.lens[s] < cols * bs]
        batch = list(rng.permutation(running)[: int(rng.integers(0, len(running) + 1))]) if running else []
        while batch and model.worst_case_blocks(batch) > model.num_free_blocks():
            batch.pop()
        for seq in batch:
            emit(APPEND, int(seq), 0)
        step_cows, _ = model.decode_step([int(s) for s in batch])
        hits.append(got), cows.append(len(step_cows))
    step_offsets.append(len(op))
    i64 = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    arrays = dict(op=i64(op), a0=i64(a0), a1=i64(a1), seq_ids=i64(seq_ids), step_offsets=i64(step_offsets),
                  decode_offsets=i64(decode_offsets), op_hash=i64(op_hash), hashes=np.array(pool, np.uint64))
    return model, arrays, i64(hits), i64(cows)


def _pool_op(model: ReferenceModel, rng, emit, pool: list[int]) -> int:
    """One random pool operation, applied to the model and emitted; returns the tokens it served from the
    cache."""
    from scenarios.trace import ALLOCATE, ALLOCATE_CACHED, CAN_ALLOCATE, FORK, FREE, SEAL

    bs, rows = model.block_size, model.max_seqs
    free_rows = [r for r in range(rows) if r not in model.tables]
    running = sorted(model.tables)
    r = rng.random()
    if r < 0.45 and free_rows:
        seq, tokens = int(rng.choice(free_rows)), int(rng.integers(1, 5 * bs))
        chain = [1 + int(rng.integers(0, 3)) * 100 + i for i in range(tokens // bs)]
        if model.cached_need(tokens, chain) > model.num_free_blocks():
            return 0
        emit(ALLOCATE_CACHED, seq, tokens, len(pool))
        pool.extend(chain)
        return model.allocate_cached(seq, tokens, np.array(chain, dtype=np.uint64))
    if r < 0.55 and free_rows and model.num_free_blocks() >= 2:
        seq = int(rng.choice(free_rows))
        emit(ALLOCATE, seq, 5), model.allocate(seq, 5)
    elif r < 0.65 and free_rows and running:
        parent, child = int(rng.choice(running)), int(rng.choice(free_rows))
        emit(FORK, parent, child), model.fork(parent, child)
    elif r < 0.8 and running:
        seq = int(rng.choice(running))
        if model.lens[seq] % bs == 0 and model.tables[seq][-1] not in model.block_hash:
            h = 500 + int(rng.integers(0, 30))
            emit(SEAL, seq, int(model.seal(seq, h)), len(pool))
            pool.append(h)
    elif running:
        seq = int(rng.choice(running))
        emit(FREE, seq, 0), model.free(seq)
    else:
        n = int(rng.integers(0, 20))
        emit(CAN_ALLOCATE, n, int(model.can_allocate(n)))
    return 0


def test_compiled_replay_reproduces_the_reference_hits() -> None:
    from harness.base.drivers import ReplayError, check_hits, compiled_driver

    model, t, expected_hits, expected_cows = caching_program(3)
    assert expected_hits.sum() > 0 and model.evictions > 0
    mgr = FlatPcBlockManager(20, 4, 6, 8)
    drive = compiled_driver(mgr.kernels, caching=True)
    steps = len(expected_hits)
    hits, cows = np.zeros(steps, np.int64), np.zeros(steps, np.int64)
    ticks_out = np.zeros((steps, 5), np.int64)
    status = drive(mgr.state, t["op"], t["a0"], t["a1"], t["seq_ids"], t["step_offsets"], t["decode_offsets"],
                   np.zeros((6, 2), np.int64), np.zeros(6, np.int64), ticks_out, cows, True, np.zeros(0, np.int64),
                   3, t["hashes"], t["op_hash"], hits)
    assert status == (0, 0, 0)
    check_hits(hits, expected_hits)
    assert (cows == expected_cows).all()
    assert mgr.num_cached_blocks() == model.num_cached_blocks() and mgr.evictions == model.evictions
    assert mgr.num_free_blocks() == model.num_free_blocks()
    assert {s: mgr.seq_len(s) for s in model.tables} == model.lens
    wrong = expected_hits.copy()
    wrong[np.flatnonzero(wrong)[0]] += 4
    with pytest.raises(ReplayError, match="served from the cache"):
        check_hits(hits, wrong)
    with pytest.raises(ValueError, match="no prefix-caching"):
        compiled_driver(FlatBlockManager.kernels, caching=True)
    assert compiled_driver(mgr.kernels) is not drive


def test_compiled_replay_refuses_a_wrong_seal_answer() -> None:
    from scenarios.trace import SEAL

    mgr = FlatPcBlockManager(4, 4, 2, 4)
    mgr.allocate(0, 4)
    drive = compiled_caching_driver_of(mgr)
    i64 = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    z = np.zeros(1, np.int64)
    status = drive(mgr.state, i64([SEAL]), i64([0]), i64([0]), i64([0]), i64([0, 1]), i64([1]),
                   np.zeros((1, 2), np.int64), z, np.zeros((1, 5), np.int64), z.copy(), False, np.zeros(0, np.int64),
                   3, np.array([7], np.uint64), i64([0]), z.copy())
    assert status == (1, 0, 0) and mgr.num_cached_blocks() == 1  # it sealed (True) where the trace said False


def compiled_caching_driver_of(mgr):
    from harness.base.drivers import compiled_driver

    return compiled_driver(mgr.kernels, caching=True)
