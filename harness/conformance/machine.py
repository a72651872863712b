"""The Hypothesis state machine that holds a class to the reference model. Design: docs/measurement.md#machine."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from impls import NoFreeBlocksError
from impls.contract import supports_prefix_caching, table_nbytes_problem
from impls.core.ids import UINT16_LIMIT
from impls.core.reference import ReferenceModel

from .idmap import IdMap

# Small enough that random calls reach full pools, full sequences and shared blocks.
CONFIG = {"num_blocks": 10, "block_size": 4, "max_seqs": 6, "max_blocks_per_seq": 5}
CONFIGS = (
    {"num_blocks": 8, "block_size": 1, "max_seqs": 6, "max_blocks_per_seq": 4},
    {"num_blocks": 6, "block_size": 2, "max_seqs": 6, "max_blocks_per_seq": 4},
    CONFIG,
    {"num_blocks": 12, "block_size": 16, "max_seqs": 6, "max_blocks_per_seq": 5},
    {"num_blocks": 5, "block_size": 64, "max_seqs": 6, "max_blocks_per_seq": 3},
    {"num_blocks": UINT16_LIMIT, "block_size": 1, "max_seqs": 6, "max_blocks_per_seq": 8},
)
# Larger pools: ref counts of in-use and end blocks per call, invariants after the last call.
FULL_SWEEP = 1024
CONTRACT_ERRORS = (ValueError, KeyError, NoFreeBlocksError)
# No slot or block id is negative: an output entry left unwritten cannot pass for a result.
SENTINEL = -7_777

OPS = ("can_allocate", "allocate", "append_slot", "fork", "free", "block_table", "seq_len", "ref_count",
       "last_slot", "decode_step", "lookup", "allocate_cached", "seal")
CACHING_OPS = ("allocate_cached", "seal")
# Shared prefixes make partial hits; a small universe reuses hashes after other predecessors.
DOCUMENTS = ((1, 2, 3, 4, 5), (1, 2, 3, 6, 7), (1, 2, 8, 9, 10), (11, 12, 13, 14, 15))
HASH_UNIVERSE = 16
# "ok" as the contract asks, the others malformed (ValueError).
CHAIN_FORMS = ("ok", "int64", "2d", "strided", "list", "big-endian")
HASH_KINDS = ("int", "uint64", "int64", "bool", "float")


def chain_array(hashes: list[int], form: str = "ok") -> object:
    """The chain ``hashes`` as ``allocate_cached`` receives it in ``form`` (see :data:`CHAIN_FORMS`)."""
    if form == "list":
        return list(hashes)
    if form == "2d":
        return np.array(hashes, np.uint64).reshape(1, -1)
    if form == "strided":
        return np.repeat(np.array(hashes, np.uint64), 2)[::2]
    dtype = {"int64": np.int64, "big-endian": np.dtype(">u8")}.get(form, np.uint64)
    return np.array([h % 2**63 for h in hashes] if form == "int64" else hashes, dtype)


def hash_value(h: int, kind: str = "int") -> object:
    """The hash ``h`` passed to ``seal`` as ``kind`` (see :data:`HASH_KINDS`)."""
    if kind == "bool":
        return bool(h)
    if kind == "float":
        return float(h)
    if kind in ("uint64", "int64"):
        return np.dtype(kind).type(h % 2**63)
    return h


def _unchanged(label: str, name: str, given: object, original: object) -> None:
    """A call's input must be as it was handed over: the contract's inputs are read-only."""
    assert np.array_equal(np.asarray(given), np.asarray(original)), (
        f"{label} wrote into its inputs: {name} became {np.asarray(given).tolist()}")


def snapshot(mgr: Any, config: dict[str, int]) -> tuple:
    """Everything observable through the contract: free count, (length, table) per active row, ref counts, and the
    number of cached blocks (None without prefix caching)."""
    tables = {}
    for seq in range(config["max_seqs"]):
        with contextlib.suppress(KeyError):
            tables[seq] = (mgr.seq_len(seq), list(mgr.block_table(seq)))
    swept = swept_ids(config["num_blocks"], (int(b) for _, table in tables.values() for b in table))
    refs = [(block, mgr.ref_count(block)) for block in swept]
    cached = mgr.num_cached_blocks() if supports_prefix_caching(mgr) else None
    return mgr.num_free_blocks(), tables, refs, cached


def swept_ids(num_blocks: int, in_use: Iterable[int]) -> Iterable[int]:
    """The block ids whose ref counts are compared: all up to :data:`FULL_SWEEP`, else in-use and end ones."""
    if num_blocks <= FULL_SWEEP:
        return range(num_blocks)
    return sorted({*range(8), *range(num_blocks - 8, num_blocks), *in_use})


def _recorded(method: Callable) -> Callable:
    """Record the call as a line of Python before running it, so the failing run can be replayed."""

    order = list(inspect.signature(method).parameters)[1:]

    @functools.wraps(method)
    def step(self: ContractMachine, **kwargs: object) -> None:
        args = ", ".join(f"{key}={kwargs[key]!r}" for key in order if key in kwargs)
        self.steps.append(f"state.{method.__name__}({args})")
        method(self, **kwargs)

    return step


def _as_rule(function: Callable) -> Callable:
    """A distinct function per rule (Hypothesis marks the function it is given)."""

    @functools.wraps(function)
    def run(self: ContractMachine, **kwargs: object) -> None:
        function(self, **kwargs)

    return run


class ContractMachine(RuleBasedStateMachine):
    """Base class: the comparisons. :func:`contract_machine` adds the rules for one implementation class."""

    impl_cls: type
    config: dict[str, int]

    def __init__(self) -> None:
        super().__init__()
        cfg = self.config
        self.model = ReferenceModel(**cfg)
        self.mgr = self.impl_cls(**cfg)
        self.twin = self.impl_cls(**cfg)
        self.ids = IdMap()
        self.name = self.impl_cls.__qualname__
        self.steps: list[str] = []

    def _expect(self, call: Callable[[], Any]) -> tuple[Any, type | None]:
        """The model's result, or the type of the contract error it raised."""
        try:
            return call(), None
        except CONTRACT_ERRORS as exc:
            return None, type(exc)

    def _run(self, target: Any, label: str, call: Callable[[Any], Any], error: type | None,
             atomic: bool = True) -> tuple[bool, Any]:
        """Run ``call(target)``: the outcome must match ``error``; with ``atomic`` a failure changes nothing."""
        atomic = atomic and error is not None
        before = snapshot(target, self.config) if atomic else None
        try:
            got = call(target)
        except Exception as exc:
            assert error is not None, f"{label} raised {exc!r}; the model succeeded"
            assert type(exc) is error, f"{label} raised {type(exc).__name__}, the model {error.__name__}"
            after = snapshot(target, self.config) if atomic else None
            assert after == before, f"{label} raised {type(exc).__name__} but changed the state: {before} -> {after}"
            return False, None
        assert error is None, f"{label} returned {got!r}; the model raised {error.__name__}"
        return True, got

    def _call(self, op: str, *args: object) -> tuple[bool, Any, Any]:
        """``op(*args)`` on the model, ``mgr`` and the twin; the twin must return exactly what ``mgr`` did."""
        expected, error = self._expect(lambda: getattr(self.model, op)(*args))
        label = f"{self.name}.{op}({', '.join(map(repr, args))})"
        ok, got = self._run(self.mgr, label, lambda m: getattr(m, op)(*args), error)
        # The twin's atomicity is mgr's (same class, same state): not re-checked.
        _, twin_got = self._run(self.twin, f"{label} (per-call twin)", lambda m: getattr(m, op)(*args), error,
                                atomic=False)
        assert twin_got == got, f"{label}: {got!r}, but {twin_got!r} on an identical instance"
        return ok, expected, got

    def _slots(self, label: str, expected: Iterable[int], got: np.ndarray) -> None:
        """Slots written to a buffer: every entry written, each one the model's up to renaming."""
        got = got.tolist()
        assert SENTINEL not in got, f"{label} did not write slot_out[{got.index(SENTINEL)}]: {got}"
        for model_slot, impl_slot in zip(expected, got, strict=True):
            self.ids.slot(model_slot, impl_slot, self.config["block_size"])

    def _bind_cow(self, label: str, expected: tuple[int, int] | None, got: tuple[int, int] | None) -> None:
        assert (got is None) == (expected is None), f"{label}: copy-on-write {got}, the model {expected}"
        if expected is not None:
            self.ids.bind(expected[0], int(got[0]))
            self.ids.bind(expected[1], int(got[1]))

    @_recorded
    def allocate(self, seq: int, tokens: int) -> None:
        self._call("allocate", seq, tokens)

    @_recorded
    def append_slot(self, seq: int) -> None:
        ok, expected, got = self._call("append_slot", seq)
        if ok:
            self._bind_cow(f"{self.name}.append_slot({seq})", expected, got)

    @_recorded
    def fork(self, parent: int, child: int) -> None:
        self._call("fork", parent, child)

    @_recorded
    def free(self, seq: int) -> None:
        self._call("free", seq)

    @_recorded
    def can_allocate(self, n: int) -> None:
        _, expected, got = self._call("can_allocate", n)
        assert got == expected, f"{self.name}.can_allocate({n}) = {got!r}, the model {expected!r}"

    @_recorded
    def seq_len(self, seq: int) -> None:
        _, expected, got = self._call("seq_len", seq)
        assert got == expected, f"{self.name}.seq_len({seq}) = {got!r}, the model {expected!r}"

    @_recorded
    def block_table(self, seq: int) -> None:
        ok, expected, got = self._call("block_table", seq)
        if ok:
            assert len(got) == len(expected), f"{self.name}.block_table({seq}) = {list(got)}, the model {expected}"
            for model_id, impl_id in zip(expected, got, strict=True):
                self.ids.bind(model_id, int(impl_id))

    @_recorded
    def last_slot(self, seq: int) -> None:
        ok, expected, got = self._call("last_slot", seq)
        if ok:
            self._slots(f"{self.name}.last_slot({seq})", [expected], np.array([got], np.int64))

    @_recorded
    def ref_count(self, block: int) -> None:
        ok, _, got = self._call("ref_count", block)
        if ok:
            model_id = self.ids.to_model.get(block)
            want = 0 if model_id is None else self.model.refs[model_id]
            assert got == want, f"{self.name}.ref_count({block}) = {got}, the model's block has {want}"

    @_recorded
    def decode_step(self, seqs: list[int]) -> None:
        n, label = len(seqs), f"{self.name}.decode_step({seqs})"
        ids = np.array(seqs, dtype=np.int64)
        cow_out, slot_out = np.full((n, 2), SENTINEL, np.int64), np.full(n, SENTINEL, np.int64)
        expected, error = self._expect(lambda: self.model.decode_step(seqs))
        ok, ncow = self._run(self.mgr, label, lambda m: m.decode_step(ids, cow_out, slot_out), error)
        _unchanged(label, "seq_ids", ids, seqs)
        if not ok:
            return
        cows, slots = expected
        assert ncow == len(cows), f"{label} returned {ncow} copy-on-writes, the model made {len(cows)}"
        pairs = cow_out[:ncow].tolist()
        assert all(SENTINEL not in pair for pair in pairs), f"{label} did not write all its cow_out pairs: {pairs}"
        for expected, got in zip(cows, pairs, strict=True):
            self._bind_cow(label, expected, tuple(got))
        self._slots(label, slots, slot_out)
        self._twin_appends(label, seqs, cow_out[:ncow].tolist(), slot_out.tolist())

    def _twin_appends(self, label: str, seqs: list[int], cows: list[list[int]], slots: list[int]) -> None:
        """The same step made of per-call appends on the twin: same pairs, same slots, same state."""
        twin_cows = [list(c) for c in (self.twin.append_slot(s) for s in seqs) if c is not None]
        twin_slots = [self.twin.last_slot(s) for s in seqs]
        assert (twin_cows, twin_slots) == (cows, slots), (
            f"{label}: copy-on-writes {cows} and slots {slots}, but per-call appends give {twin_cows} and {twin_slots}"
        )
        mine, twin = snapshot(self.mgr, self.config), snapshot(self.twin, self.config)
        assert mine == twin, f"{label}: state {mine}, but per-call appends leave {twin}"

    @_recorded
    def allocate_cached(self, seq: int, tokens: int, hashes: list[int], form: str = "ok") -> None:
        chain = chain_array(hashes, form)
        _, expected, got = self._call("allocate_cached", seq, tokens, chain)
        _unchanged(f"{self.name}.allocate_cached({seq}, {tokens}, {hashes})", "hash chain", chain,
                   chain_array(hashes, form))
        assert got == expected, f"{self.name}.allocate_cached({seq}, {tokens}, {hashes}) served {got!r} tokens " \
                                f"from the cache, the model {expected!r}"

    @_recorded
    def seal(self, seq: int, h: int, kind: str = "int") -> None:
        _, expected, got = self._call("seal", seq, hash_value(h, kind))
        assert got == expected, f"{self.name}.seal({seq}, {h}) = {got!r}, the model {expected!r}"

    @_recorded
    def lookup(self, seqs: list[int]) -> None:
        label, ids = f"{self.name}.lookup({seqs})", np.array(seqs, dtype=np.int64)
        slot_out = np.full(len(seqs), SENTINEL, np.int64)
        slots, error = self._expect(lambda: [self.model.last_slot(s) for s in seqs])
        ok, _ = self._run(self.mgr, label, lambda m: m.lookup(ids, slot_out), error)
        _unchanged(label, "seq_ids", ids, seqs)
        if ok:
            self._slots(label, slots, slot_out)
            per_call = [self.twin.last_slot(s) for s in seqs]
            assert slot_out.tolist() == per_call, f"{label} wrote {slot_out.tolist()}; last_slot gives {per_call}"

    def same_state(self) -> None:
        """Free count, active rows, lengths, tables and every ref count agree with the model."""
        self.steps.append("state.same_state()")
        model, mgr, ids = self.model, self.mgr, self.ids
        assert mgr.num_free_blocks() == model.num_free_blocks(), (
            f"{self.name}: {mgr.num_free_blocks()} free blocks, the model {model.num_free_blocks()}"
        )
        for seq in range(self.config["max_seqs"]):
            self._same_row(seq)
        for impl_id in swept_ids(self.config["num_blocks"], ids.to_model):
            model_id = ids.to_model.get(impl_id)
            expected = 0 if model_id is None else model.refs[model_id]
            got = mgr.ref_count(impl_id)
            assert got == expected, f"{self.name}: ref count of block {impl_id} is {got}, the model {expected}"
        if supports_prefix_caching(mgr):
            cached = mgr.num_cached_blocks()
            assert cached == model.num_cached_blocks(), (
                f"{self.name}: {cached} cached blocks, the model {model.num_cached_blocks()}"
            )
        ids.forget_free(model.refs, keep=model.block_hash)
        if self.config["num_blocks"] <= FULL_SWEEP:
            self._own_invariants()

    def teardown(self) -> None:
        """After a large pool's last call, the design's own invariants (a sweep of the pool)."""
        if self.config["num_blocks"] > FULL_SWEEP:
            self.steps.append("state.teardown()")
            self._own_invariants()

    def _own_invariants(self) -> None:
        check = getattr(self.mgr, "check_invariants", None)
        if callable(check):
            check()

    def _same_row(self, seq: int) -> None:
        model, mgr = self.model, self.mgr
        if seq not in model.tables:
            with contextlib.suppress(KeyError):
                mgr.seq_len(seq)
                raise AssertionError(f"{self.name}: sequence {seq} should be inactive")
            return
        length = mgr.seq_len(seq)
        assert length == model.lens[seq], f"{self.name}: {seq} has {length} tokens, the model {model.lens[seq]}"
        table = list(mgr.block_table(seq))
        problem = table_nbytes_problem(mgr.table_nbytes(seq))
        assert not problem, f"{self.name}: {problem} for sequence {seq}"
        expected = model.tables[seq]
        assert len(table) == len(expected), f"{self.name}: table of {seq} is {table}, the model's {expected}"
        for model_id, impl_id in zip(model.tables[seq], table, strict=True):
            self.ids.bind(model_id, int(impl_id))


class _Rules:
    """What Hypothesis calls."""

    @staticmethod
    def _pick(rows: list[int], pick: int) -> int:
        return rows[pick % len(rows)] if rows else pick % 2

    @staticmethod
    def _live(m: ContractMachine) -> list[int]:
        return sorted(m.model.tables)

    @staticmethod
    def allocate_rest_of_pool(m: ContractMachine, seq: int, partial: bool) -> None:
        """Drain the pool, so that exhaustion paths (appends, copy-on-write, steps) get exercised."""
        blocks = max(1, min(m.model.num_free_blocks(), m.config["max_blocks_per_seq"]))
        m.allocate(seq=seq, tokens=blocks * m.config["block_size"] - partial)

    @staticmethod
    def fork_live(m: ContractMachine, parent: int, child: int) -> None:
        free_rows = [s for s in range(m.config["max_seqs"]) if s not in m.model.tables]
        m.fork(parent=_Rules._pick(_Rules._live(m), parent), child=_Rules._pick(free_rows, child))

    @staticmethod
    def free_live(m: ContractMachine, seq: int) -> None:
        m.free(seq=_Rules._pick(_Rules._live(m), seq))

    @staticmethod
    def append_live(m: ContractMachine, seq: int) -> None:
        m.append_slot(seq=_Rules._pick(_Rules._live(m), seq))

    @staticmethod
    def decode_running(m: ContractMachine, start: int) -> None:
        """A scheduler's step: every live sequence once, starting at some row."""
        live = _Rules._live(m)
        k = start % len(live) if live else 0
        m.decode_step(seqs=live[k:] + live[:k])

    @staticmethod
    def lookup_running(m: ContractMachine) -> None:
        m.lookup(seqs=_Rules._live(m))

    @staticmethod
    def admit_document(m: ContractMachine, seq: int, tokens: int, doc: tuple[int, ...]) -> None:
        """A valid admission into a free row: the first full blocks of a document."""
        free_rows = [s for s in range(m.config["max_seqs"]) if s not in m.model.tables]
        m.allocate_cached(seq=_Rules._pick(free_rows, seq), tokens=tokens,
                          hashes=list(doc[: tokens // m.config["block_size"]]))

    @staticmethod
    def seal_live(m: ContractMachine, seq: int, h: int) -> None:
        """Seal a live row, preferring one whose last block is full (the others answer E_NOT_FULL)."""
        live = _Rules._live(m)
        full = [s for s in live if m.model.lens[s] % m.config["block_size"] == 0]
        m.seal(seq=_Rules._pick(full or live, seq), h=h)


def _rules(config: dict[str, int]) -> dict[str, tuple[str, Callable, dict]]:
    """rule name -> (contract op it exercises, function, argument strategies) for one configuration."""
    seqs = st.integers(-1, config["max_seqs"])
    pick = st.integers(0, 63)
    longest = config["block_size"] * config["max_blocks_per_seq"]
    tokens = st.one_of(st.integers(1, 8), st.integers(-1, longest + 2))
    m, r = ContractMachine, _Rules
    return {
        "allocate": ("allocate", m.allocate, {"seq": seqs, "tokens": tokens}),
        "allocate_rest_of_pool": ("allocate", r.allocate_rest_of_pool, {"seq": seqs, "partial": st.booleans()}),
        "append_slot": ("append_slot", m.append_slot, {"seq": seqs}),
        "append_live": ("append_slot", r.append_live, {"seq": pick}),
        "fork": ("fork", m.fork, {"parent": seqs, "child": seqs}),
        "fork_live": ("fork", r.fork_live, {"parent": pick, "child": pick}),
        "free": ("free", m.free, {"seq": seqs}),
        "free_live": ("free", r.free_live, {"seq": pick}),
        "can_allocate": ("can_allocate", m.can_allocate, {"n": st.integers(-1, config["num_blocks"] + 1)}),
        "seq_len": ("seq_len", m.seq_len, {"seq": seqs}),
        "block_table": ("block_table", m.block_table, {"seq": seqs}),
        "last_slot": ("last_slot", m.last_slot, {"seq": seqs}),
        "ref_count": ("ref_count", m.ref_count, {"block": st.integers(-1, config["num_blocks"])}),
        "decode_step": ("decode_step", m.decode_step, {"seqs": st.lists(seqs, max_size=config["max_seqs"] + 1)}),
        "decode_running": ("decode_step", r.decode_running, {"start": pick}),
        "lookup": ("lookup", m.lookup, {"seqs": st.lists(seqs, max_size=config["max_seqs"])}),
        "lookup_running": ("lookup", r.lookup_running, {}),
        **_caching_rules(config, seqs, pick, tokens),
    }


def _caching_rules(config: dict[str, int], seqs: st.SearchStrategy, pick: st.SearchStrategy,
                   tokens: st.SearchStrategy) -> dict[str, tuple[str, Callable, dict]]:
    """The rules of prefix caching's operations (see :data:`CACHING_OPS`)."""
    size, most = config["block_size"], config["max_blocks_per_seq"]
    hashes = st.integers(1, HASH_UNIVERSE)
    whole = st.integers(1, most).map(lambda k: k * size)
    docs = st.one_of(st.sampled_from(DOCUMENTS), st.lists(hashes, min_size=most, max_size=most, unique=True))
    any_chain = st.lists(st.integers(0, HASH_UNIVERSE), max_size=most + 1)
    m, r = ContractMachine, _Rules
    return {
        "admit_document": ("allocate_cached", r.admit_document,
                           {"seq": pick, "tokens": st.one_of(whole, st.integers(1, size * most)), "doc": docs}),
        "allocate_cached": ("allocate_cached", m.allocate_cached,
                            {"seq": seqs, "tokens": tokens, "hashes": any_chain, "form": st.sampled_from(CHAIN_FORMS)}),
        "seal_live": ("seal", r.seal_live, {"seq": pick, "h": hashes}),
        "seal": ("seal", m.seal, {"seq": seqs, "h": st.one_of(st.integers(0, HASH_UNIVERSE), st.just(2**64)),
                                  "kind": st.sampled_from(HASH_KINDS)}),
    }


def contract_machine(impl_cls: type, config: dict[str, int] | None = None,
                     ops: Iterable[str] | None = None) -> type[ContractMachine]:
    """A state machine class checking ``impl_cls`` against the reference model."""
    config = dict(CONFIG if config is None else config)
    selected = set(OPS if ops is None else ops)
    unknown = selected - set(OPS)
    if unknown or not selected:
        raise ValueError(f"ops must be a non-empty subset of {OPS}; unknown: {sorted(unknown)}")
    body: dict[str, object] = {"impl_cls": impl_cls, "config": config,
                               "same_state": invariant()(ContractMachine.same_state)}
    caching = supports_prefix_caching(impl_cls)
    if not caching and selected <= set(CACHING_OPS):
        raise ValueError(f"{impl_cls.__qualname__} has no prefix caching: ops {sorted(selected)} select nothing")
    for name, (op, function, strategies) in _rules(config).items():
        if op in selected and (caching or op not in CACHING_OPS):
            body[f"rule_{name}"] = rule(**strategies)(_as_rule(function))
    return type(f"{impl_cls.__name__}Conformance", (ContractMachine,), body)
