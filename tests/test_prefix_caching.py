"""Prefix caching (impls.contract.CachingBlockManager): every design with ``prefix_caching = True`` against the rules.

(a) Hand-written cases, one per rule, on every caching design and on the reference model itself (the expected
    values are written here from the contract's text, so they check the model too). Block ids are compared
    through the tables, never as numbers: designs may hand out ids in any order.
(b) A random-program differential test: biased random programs (admissions from a small hash universe, so hits
    are common; a small pool, so evictions are) run through the conformance machine (harness.conformance), which
    compares every call with the reference model up to a renaming of block ids. A failure prints the program as a
    runnable reproduction. Longer programs run under the ``slow`` marker.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from harness.conformance import check, render_reproduction
from harness.conformance.machine import DOCUMENTS, HASH_UNIVERSE, ContractMachine, contract_machine, snapshot
from harness.run.matrix import CACHE_OPS_SCENARIO, REGIMES, default_cells, is_caching
from impls import REGISTRY, UNAVAILABLE, NoFreeBlocksError, registry
from impls.caching.dict_pc import DictPcBlockManager
from impls.caching.radix_pc import RadixPcBlockManager
from impls.contract import supports_prefix_caching
from impls.core.reference import ReferenceModel
from scenarios import SCENARIOS

CFG = {"num_blocks": 8, "block_size": 4, "max_seqs": 4, "max_blocks_per_seq": 4}
TINY = {**CFG, "num_blocks": 4}  # a pool where every take past the never-cached blocks evicts


def caching_names() -> list:
    """Registered implementations with prefix caching (those unavailable here are skipped, with the reason)."""
    params = [name for name in sorted(REGISTRY) if supports_prefix_caching(REGISTRY[name])]
    params += [pytest.param(name, marks=pytest.mark.skip(reason=f"{name} unavailable: {why}"))
               for name, why in sorted(UNAVAILABLE.items()) if registry.record(name).role == "caching"]
    return params


@pytest.fixture(params=[*caching_names(), "reference"])
def make(request: pytest.FixtureRequest):
    """A constructor for the design under test (``"reference"``: the reference model)."""
    cls = ReferenceModel if request.param == "reference" else REGISTRY[request.param]
    return lambda **cfg: cls(**{**CFG, **cfg})


def chain(*hashes: int) -> np.ndarray:
    return np.array(hashes, dtype=np.uint64)


def state(mgr, cfg: dict | None = None) -> tuple:
    """Everything observable (conformance snapshot: free count, rows, ref counts, cached count)."""
    return snapshot(mgr, {**CFG, **(cfg or {})})


# -- (a) the rules, one case each --------------------------------------------------------------------------------
def test_full_hit_shares_every_block(make) -> None:
    mgr = make()
    assert mgr.allocate_cached(0, 8, chain(1, 2)) == 0
    assert mgr.num_cached_blocks() == 2 and mgr.num_free_blocks() == 6
    assert mgr.allocate_cached(1, 8, chain(1, 2)) == 8
    assert mgr.block_table(1) == mgr.block_table(0)
    assert [mgr.ref_count(b) for b in mgr.block_table(0)] == [2, 2]
    assert mgr.num_free_blocks() == 6 and mgr.num_cached_blocks() == 2


def test_partial_hit_then_fresh_blocks(make) -> None:
    mgr = make()
    mgr.allocate_cached(0, 8, chain(1, 2))
    assert mgr.allocate_cached(1, 14, chain(1, 3, 4)) == 4  # 3 full blocks and a partial one; the first hits
    t0, t1 = mgr.block_table(0), mgr.block_table(1)
    assert t1[0] == t0[0] and len(set(t1[1:]) | set(t0)) == 5
    assert mgr.num_cached_blocks() == 4  # 1, 2, 3, 4: the partial block is never cached
    assert mgr.num_free_blocks() == 8 - 5


def test_miss_takes_fresh_blocks(make) -> None:
    mgr = make()
    mgr.allocate_cached(0, 8, chain(1, 2))
    assert mgr.allocate_cached(1, 8, chain(5, 1)) == 0  # lookup stops at the first miss: 1 is not a hit here
    assert not set(mgr.block_table(1)) & set(mgr.block_table(0))
    assert mgr.num_cached_blocks() == 3  # 5 inserted; 1 is carried by seq 0's block, so not inserted again


def test_hash_cached_elsewhere_is_not_inserted_again_and_hits_later(make) -> None:
    mgr = make()
    mgr.allocate_cached(0, 8, chain(1, 2))
    mgr.allocate_cached(1, 8, chain(3, 2))  # miss at 3; 2 is carried already: seq 1's second block stays uncached
    t0, t1 = mgr.block_table(0), mgr.block_table(1)
    assert mgr.num_cached_blocks() == 3
    mgr.free(1)  # its second block (uncached) goes back to the never-cached blocks, its first is evictable
    assert mgr.num_free_blocks() == 8 - 2 and mgr.num_cached_blocks() == 3
    assert mgr.allocate_cached(2, 8, chain(3, 2)) == 8  # the cache is keyed by hash, whatever the chain
    assert mgr.block_table(2) == [t1[0], t0[1]]


def test_eviction_takes_never_cached_first_then_least_recently_freed_tail_first(make) -> None:
    mgr = make(**TINY)
    mgr.allocate_cached(0, 8, chain(1, 2))
    mgr.allocate_cached(1, 8, chain(3, 4))
    mgr.free(0)  # evictable, oldest first: 2 (its tail), 1
    mgr.free(1)  # then 4, 3
    assert mgr.num_free_blocks() == 4 and mgr.num_cached_blocks() == 4
    mgr.allocate(2, 4)  # no never-cached block left: evicts 2
    assert mgr.num_cached_blocks() == 3 and mgr.num_free_blocks() == 3
    assert mgr.allocate_cached(3, 8, chain(1, 2)) == 4  # 1 hits; the fresh block for 2 evicts 4, then carries 2
    assert mgr.num_cached_blocks() == 3
    mgr.free(3)
    mgr.free(2)
    assert mgr.allocate_cached(0, 8, chain(3, 4)) == 4  # 3 survived (freed after 4), 4 was evicted


def test_hit_on_an_evictable_block_takes_it_out_of_the_lru(make) -> None:
    mgr = make(**TINY)
    mgr.allocate_cached(0, 8, chain(1, 2))
    mgr.free(0)
    assert mgr.num_free_blocks() == 4  # evictable blocks count as free
    assert mgr.allocate_cached(1, 4, chain(1)) == 4
    kept = mgr.block_table(1)[0]
    assert mgr.ref_count(kept) == 1 and mgr.num_free_blocks() == 3
    mgr.allocate(2, 12)  # two never-cached blocks, then one eviction: 2, not the block seq 1 holds
    assert kept not in mgr.block_table(2) and mgr.num_cached_blocks() == 1
    with pytest.raises(NoFreeBlocksError):
        mgr.allocate(3, 1)
    assert mgr.block_table(1) == [kept] and mgr.ref_count(kept) == 1


def test_fork_shares_cached_blocks_and_both_frees_make_them_evictable(make) -> None:
    mgr = make()
    mgr.allocate_cached(0, 8, chain(1, 2))
    mgr.fork(0, 1)
    assert mgr.block_table(1) == mgr.block_table(0) and [mgr.ref_count(b) for b in mgr.block_table(1)] == [2, 2]
    mgr.free(0)
    assert mgr.num_free_blocks() == 6 and [mgr.ref_count(b) for b in mgr.block_table(1)] == [1, 1]
    mgr.free(1)
    assert mgr.num_free_blocks() == 8 and mgr.num_cached_blocks() == 2
    assert mgr.allocate_cached(2, 9, chain(1, 2)) == 8


def test_copy_on_write_after_fork_copies_only_the_partial_block(make) -> None:
    mgr = make()
    mgr.allocate_cached(0, 6, chain(1))
    mgr.fork(0, 1)
    cached, partial = mgr.block_table(0)
    src, dst = mgr.append_slot(1)
    assert src == partial and dst not in (cached, partial)
    assert mgr.block_table(1) == [cached, dst] and mgr.ref_count(cached) == 2
    assert mgr.append_slot(0) is None and mgr.num_cached_blocks() == 1


def test_seal_caches_a_full_last_block_once(make) -> None:
    mgr = make()
    mgr.allocate_cached(0, 3, chain())
    mgr.append_slot(0)
    assert mgr.seal(0, 7) is True and mgr.num_cached_blocks() == 1
    assert mgr.allocate_cached(1, 4, chain(7)) == 4 and mgr.block_table(1) == mgr.block_table(0)
    mgr.allocate(2, 4)
    assert mgr.seal(2, np.uint64(7)) is False  # another block carries 7: this one stays uncached
    assert mgr.num_cached_blocks() == 1
    mgr.free(2)
    assert mgr.num_free_blocks() == 7 and mgr.num_cached_blocks() == 1


def test_seal_re_keys_a_block_whose_chain_hash_is_cached_elsewhere(make) -> None:
    mgr = make()
    mgr.allocate_cached(0, 4, chain(3))
    mgr.allocate_cached(1, 12, chain(1, 2, 3))  # 3 is carried by seq 0's block: seq 1's third block stays uncached
    t0, t1 = mgr.block_table(0), mgr.block_table(1)
    assert mgr.seal(1, 13) is True  # that block now carries 13, and 3 stays with seq 0's
    assert mgr.allocate_cached(2, 16, chain(1, 2, 3, 4)) == 12
    assert mgr.block_table(2)[:3] == [t1[0], t1[1], t0[0]]
    assert mgr.allocate_cached(3, 12, chain(1, 2, 13)) == 12 and mgr.block_table(3) == t1


SETUPS = {  # seq 0 (and seq 1 for "hit"): what the last block is before the failing seal
    "partial": lambda mgr: mgr.allocate(0, 3),
    "full": lambda mgr: mgr.allocate(0, 4),
    "sealed": lambda mgr: mgr.allocate_cached(0, 4, chain(5)),
    "hit": lambda mgr: (mgr.allocate_cached(0, 4, chain(5)), mgr.allocate_cached(1, 4, chain(5))),
}
NOT_FULL, SEALED, BAD_HASH = "not full", "already carries a hash", "invalid block hash"


@pytest.mark.parametrize(("setup", "seq", "h", "error", "says"), [
    pytest.param("partial", 0, 9, ValueError, NOT_FULL, id="not-full"),
    pytest.param("sealed", 0, 9, ValueError, SEALED, id="already-sealed"),
    pytest.param("hit", 1, 9, ValueError, SEALED, id="hit-block-carries-a-hash"),
    pytest.param("full", 0, 0, ValueError, BAD_HASH, id="hash-0"),
    pytest.param("full", 0, 2**64, ValueError, BAD_HASH, id="hash-2**64"),
    pytest.param("full", 0, -1, ValueError, BAD_HASH, id="hash-negative"),
    pytest.param("full", 0, np.int64(-3), ValueError, BAD_HASH, id="hash-numpy-negative"),
    pytest.param("full", 0, True, ValueError, BAD_HASH, id="hash-bool"),
    pytest.param("full", 0, 1.0, ValueError, BAD_HASH, id="hash-float"),
    pytest.param("full", 0, "1", ValueError, BAD_HASH, id="hash-str"),
    pytest.param("full", 2, 9, KeyError, "not active", id="inactive"),
    pytest.param("full", 4, 9, ValueError, "outside", id="out-of-range"),
    pytest.param("partial", 2, 0, KeyError, "not active", id="inactive-before-hash"),
    pytest.param("partial", 0, 0, ValueError, BAD_HASH, id="hash-before-full"),
    pytest.param("sealed", 0, 0, ValueError, BAD_HASH, id="hash-before-sealed"),
])
def test_seal_errors_change_nothing(make, setup: str, seq: int, h: object, error: type, says: str) -> None:
    mgr = make()
    SETUPS[setup](mgr)
    before = state(mgr)
    with pytest.raises(error) as raised:
        mgr.seal(seq, h)
    assert state(mgr) == before
    if not isinstance(mgr, ReferenceModel):  # the model states the rules, the designs the contract's messages
        assert says in str(raised.value)


BAD_CHAINS = {
    "int64": np.array([1, 2], np.int64),
    "big-endian": np.array([1, 2], ">u8"),
    "2-D": np.array([[1, 2]], np.uint64),
    "non-contiguous": np.array([1, 9, 2, 9], np.uint64)[::2],
    "too-short": chain(1),
    "too-long": chain(1, 2, 3),
    "zero": chain(1, 0),
    "duplicate": chain(3, 3),
    "list": [1, 2],
    "float": np.array([1.0, 2.0]),
    "bool": np.array([True, True]),
}


@pytest.mark.parametrize("case", BAD_CHAINS)
def test_invalid_chains_are_refused_before_the_row_state(make, case: str) -> None:
    mgr = make()
    mgr.allocate_cached(0, 8, chain(1, 2))
    before = state(mgr)
    for seq in (1, 0):  # a free row and an active one: the chain is checked first (ValueError, not KeyError)
        with pytest.raises(ValueError):
            mgr.allocate_cached(seq, 9, BAD_CHAINS[case])
        assert state(mgr) == before


def test_chain_errors_name_the_contract_code() -> None:
    for name in caching_names():
        if isinstance(name, str):
            with pytest.raises(ValueError, match="invalid block hash for sequence 1"):
                REGISTRY[name](**CFG).allocate_cached(1, 8, chain(4, 4))


@pytest.mark.parametrize("name", caching_names())
def test_argument_types_come_first(name: str) -> None:
    mgr = REGISTRY[name](**CFG)
    for args in ((1.0, 8, chain(1, 2)), (True, 8, chain(1, 2)), (1, 8.0, chain(1, 2)), (1, None, [])):
        with pytest.raises(TypeError):
            mgr.allocate_cached(*args)
    with pytest.raises(TypeError):
        mgr.seal("0", 1)
    assert mgr.allocate_cached(np.int32(1), np.uint16(8), chain(1, 2)) == 0 and mgr.seq_len(1) == 8


def test_no_free_blocks_counts_evictable_hits_and_changes_nothing(make) -> None:
    mgr = make(**TINY)
    mgr.allocate_cached(0, 8, chain(1, 2))
    mgr.free(0)
    mgr.allocate(1, 8)  # the two never-cached blocks: two evictable blocks are left
    assert mgr.num_free_blocks() == 2 and mgr.can_allocate(2) and not mgr.can_allocate(3)
    before = state(mgr, TINY)
    with pytest.raises(NoFreeBlocksError):  # two evictable hits and one fresh block: three free blocks needed
        mgr.allocate_cached(2, 12, chain(1, 2, 3))
    assert state(mgr, TINY) == before
    assert mgr.allocate_cached(2, 8, chain(1, 2)) == 8 and mgr.num_free_blocks() == 0
    with pytest.raises(NoFreeBlocksError):
        mgr.append_slot(2)
    assert mgr.num_cached_blocks() == 2


def test_decode_step_evicts_like_appends(make) -> None:
    mgr = make(**TINY)
    mgr.allocate_cached(0, 8, chain(1, 2))
    mgr.allocate_cached(1, 8, chain(3, 4))
    mgr.free(0)  # 2, 1 evictable
    if isinstance(mgr, ReferenceModel):
        cows, _ = mgr.decode_step([1])
        assert cows == []
    else:
        ids, cow, slot = np.array([1], np.int64), np.zeros((1, 2), np.int64), np.zeros(1, np.int64)
        assert mgr.decode_step(ids, cow, slot) == 0
    assert mgr.num_cached_blocks() == 3  # 2 evicted for the new block
    mgr.free(1)  # its new block is never-cached: the next fresh block
    assert mgr.allocate_cached(0, 8, chain(1, 2)) == 4 and mgr.num_cached_blocks() == 4


# -- (b) random programs against the reference model -------------------------------------------------------------
PROGRAM_CFG = {"num_blocks": 8, "block_size": 2, "max_seqs": 5, "max_blocks_per_seq": 4}


def _admit(m: ContractMachine, rng: random.Random, live: list[int], free: list[int]) -> None:
    size, most = m.config["block_size"], m.config["max_blocks_per_seq"]
    # mostly documents sharing prefixes (hits), else a chain from the small universe (hashes after new neighbours)
    doc = rng.choice(DOCUMENTS) if rng.random() < 0.7 else rng.sample(range(1, HASH_UNIVERSE + 1), most)
    tokens = rng.randint(1, most) * size if rng.random() < 0.5 else rng.randint(1, size * most)
    seq = rng.choice(free) if free and rng.random() < 0.95 else rng.randrange(m.config["max_seqs"])
    m.allocate_cached(seq=seq, tokens=tokens, hashes=list(doc[: tokens // size]))


def _seal(m: ContractMachine, rng: random.Random, live: list[int], free: list[int]) -> None:
    full = [s for s in live if m.model.lens[s] % m.config["block_size"] == 0]
    seq = rng.choice(full or live or [0])
    m.seal(seq=seq, h=rng.randint(1, HASH_UNIVERSE))


def _decode(m: ContractMachine, rng: random.Random, live: list[int], free: list[int]) -> None:
    k = rng.randrange(len(live)) if live else 0
    m.decode_step(seqs=live[k:] + live[:k])


def _misc(m: ContractMachine, rng: random.Random, live: list[int], free: list[int]) -> None:
    """The other operations, and some invalid calls."""
    r = rng.random()
    if r < 0.3 and live and free:
        m.fork(parent=rng.choice(live), child=rng.choice(free))
    elif r < 0.5 and live:
        m.append_slot(seq=rng.choice(live))
    elif r < 0.65:
        m.allocate(seq=rng.choice(free or [0]), tokens=rng.randint(1, 6))
    elif r < 0.75:
        m.can_allocate(n=rng.randint(0, m.config["num_blocks"] + 1))
    elif r < 0.9:
        m.allocate_cached(seq=rng.choice(free or [0]), tokens=rng.randint(1, 9),
                          hashes=[rng.randint(0, 4) for _ in range(rng.randint(0, 5))],
                          form=rng.choice(("ok", "ok", "int64", "strided", "list")))
    else:
        m.seal(seq=rng.choice(live or [0]), h=rng.choice((0, 3, 2**64)), kind=rng.choice(("int", "bool", "uint64")))


def _free(m: ContractMachine, rng: random.Random, live: list[int], free: list[int]) -> None:
    m.free(seq=rng.choice(live or [0]))


MOVES = ((_admit, 0.35), (_free, 0.2), (_decode, 0.2), (_seal, 0.1), (_misc, 0.15))


def run_program(cls: type, seed: int, steps: int, cfg: dict = PROGRAM_CFG, moves: tuple = MOVES) -> ContractMachine:
    """A random program of ``steps`` calls on ``cls`` next to the reference model, compared after each call."""
    machine = contract_machine(cls, cfg)()
    rng = random.Random(seed)
    moves, weights = zip(*moves, strict=True)
    try:
        for _ in range(steps):
            live = sorted(machine.model.tables)
            free = [s for s in range(cfg["max_seqs"]) if s not in machine.model.tables]
            rng.choices(moves, weights)[0](machine, rng, live, free)
            machine.same_state()
    except AssertionError as exc:
        script = render_reproduction(cls, cfg, machine.steps, f"AssertionError: {exc}")
        raise AssertionError(f"seed {seed}: {exc}\n\nReproduction:\n{script}") from None
    return machine


def _program_stats(cls: type, seeds: range, steps: int) -> dict[str, int]:
    evictions = hits = 0
    for seed in seeds:
        machine = run_program(cls, seed, steps)
        evictions += machine.model.evictions
        hits += sum("allocate_cached" in s for s in machine.steps)  # calls made (valid or not)
    return {"evictions": evictions, "admissions": hits}


@pytest.mark.parametrize("name", caching_names())
def test_random_programs_match_the_reference(name: str) -> None:
    stats = _program_stats(REGISTRY[name], range(20), 200)
    # The programs are deterministic: they must reach the rules they are meant to check.
    assert stats["evictions"] >= 400 and stats["admissions"] >= 1200, stats


@pytest.mark.slow
@pytest.mark.parametrize("name", caching_names())
def test_random_programs_at_length(name: str) -> None:
    _program_stats(REGISTRY[name], range(100, 250), 400)


@pytest.mark.slow
@pytest.mark.parametrize("name", caching_names())
def test_conformance_machine_with_caching_only(name: str) -> None:
    ops = ("allocate_cached", "seal", "free", "append_slot", "decode_step", "fork", "can_allocate")
    verdict = check(REGISTRY[name], seeds=(0, 1), max_examples=150, ops=ops, config=PROGRAM_CFG)
    assert verdict.ok, str(verdict)


# -- the differential test fails broken designs --------------------------------------------------------------------
class EvictsNewest(DictPcBlockManager):
    """Broken on purpose: evicts the most recently freed block."""

    def _take(self) -> int:
        if not self._free_list and self._num_evictable:
            n = self.num_blocks
            self._next[n], self._prev[n] = self._prev[n], self._next[n]  # reverse the ring's ends, once
            block = super()._take()
            self._next[n], self._prev[n] = self._prev[n], self._next[n]
            return block
        return super()._take()


class FreesHeadFirst(DictPcBlockManager):
    """Broken on purpose: ``free`` releases a table's first block first."""

    def _free(self, seq_id: int) -> None:
        table = self._tables[seq_id]
        self._tables[seq_id] = {i: table[len(table) - 1 - i] for i in range(len(table))}
        super()._free(seq_id)


class HitStaysEvictable(DictPcBlockManager):
    """Broken on purpose: a hit on an evictable block leaves it in the LRU (and counted as free)."""

    def _admit(self, seq_id: int, hits: list[int], num_blocks: int, chain: list[int]) -> None:
        for block in hits:
            self._refs[block] = self._refs.get(block, 0)  # looks live: no unlink
        super()._admit(seq_id, hits, num_blocks, chain)


class ReinsertsCarriedHash(DictPcBlockManager):
    """Broken on purpose: a fresh block takes over a hash another block carries."""

    def _admit(self, seq_id: int, hits: list[int], num_blocks: int, chain: list[int]) -> None:
        super()._admit(seq_id, hits, num_blocks, chain)
        table = self._tables[seq_id]
        for i in range(len(hits), len(chain)):
            old = self._cache[chain[i]]
            if old != table[i]:
                self._hash_of[old] = 0
                self._cache[chain[i]] = table[i]
                self._hash_of[table[i]] = chain[i]


@pytest.mark.parametrize("broken", [EvictsNewest, FreesHeadFirst, HitStaysEvictable, ReinsertsCarriedHash],
                         ids=lambda c: c.__name__)
def test_random_programs_fail_broken_designs(broken: type) -> None:
    with pytest.raises(AssertionError, match="Reproduction"):
        for seed in range(12):
            run_program(broken, seed, 150)


def test_caching_designs_run_on_the_caching_scenarios_and_in_the_step_regime_on_paper() -> None:
    """The role is registered; the default matrix runs it on caching scenarios, and on the plain ones only as
    every implementation runs on paper: one step() call per decode step (like against like)."""
    names = registry.names("caching")
    assert {"dict-pc", "radix-pc"} <= set(names) and "caching" in registry.ROLES
    assert set(default_cells("paper", names, REGIMES)) == {(n, "step") for n in names}
    assert not default_cells("concurrency-64", names, REGIMES)
    cached = [s for s in SCENARIOS if is_caching(s)]
    for s in cached:  # batched on every caching scenario, per call on the caching study's
        regimes = ("batched", "per-call") if s == CACHE_OPS_SCENARIO else ("batched",)
        assert set(default_cells(s, names, REGIMES)) == {(n, r) for n in names for r in regimes}
    assert len(cached) >= 5 and CACHE_OPS_SCENARIO in cached
    # the caching engine contender (18 us per sequence-step) runs on one caching scenario, the study's
    engines = [n for n in registry.names("contender") if n in REGISTRY and supports_prefix_caching(REGISTRY[n])]
    assert engines and {s for s in cached if default_cells(s, engines, REGIMES)} == {CACHE_OPS_SCENARIO}


class CountsInnerEvictions(RadixPcBlockManager):
    """radix-pc, counting evictions of nodes that still have children (SGLang evicts leaves only)."""

    inner = 0

    def _pop_oldest(self):
        node = super()._pop_oldest()
        type(self).inner += bool(node.children)
        return node


def _consistent_admit(m: ContractMachine, rng: random.Random, live: list[int], free: list[int]) -> None:
    size, most = m.config["block_size"], m.config["max_blocks_per_seq"]
    tokens = rng.randint(1, size * most)
    m.allocate_cached(seq=rng.choice(free or [0]), tokens=tokens, hashes=list(rng.choice(DOCUMENTS)[: tokens // size]))


def test_radix_evicts_only_leaves_when_chains_are_prefix_consistent() -> None:
    """radix-pc's docstring: with prefix-consistent chains (no seal of arbitrary hashes, no chain from the random
    universe) the contract's choice is always a leaf, SGLang's; the full programs do evict inner nodes."""
    CountsInnerEvictions.inner = 0
    evictions = sum(run_program(CountsInnerEvictions, seed, 200).model.evictions for seed in range(10))
    assert CountsInnerEvictions.inner > 0 and evictions > CountsInnerEvictions.inner
    consistent = ((_consistent_admit, 0.4), (_free, 0.3), (_decode, 0.3))
    CountsInnerEvictions.inner = 0
    evictions = sum(run_program(CountsInnerEvictions, seed, 200, moves=consistent).model.evictions
                    for seed in range(10))
    assert evictions >= 100 and CountsInnerEvictions.inner == 0, evictions
