"""Every registered implementation behaves like the reference model under random valid and invalid calls.

Results, exception types, free counts, ref counts, tables and copy-on-write pairs are compared after every
operation, up to a renaming of physical block ids (implementations may hand out blocks in any order).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from impls import REGISTRY, NoFreeBlocksError
from impls.reference import ReferenceModel
from tests.idmap import IdMap

CFG = {"num_blocks": 10, "block_size": 4, "max_seqs": 6, "max_blocks_per_seq": 5}
SEQS = st.integers(-1, CFG["max_seqs"])  # includes one id below and one above the range
TOKENS = st.one_of(st.integers(1, 8), st.integers(-1, CFG["block_size"] * CFG["max_blocks_per_seq"] + 2))
CONTRACT_ERRORS = (ValueError, KeyError, NoFreeBlocksError)


class ContractMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = ReferenceModel(**CFG)
        self.impls = {name: cls(**CFG) for name, cls in REGISTRY.items()}
        self.maps = {name: IdMap() for name in self.impls}

    def _call(self, op: str, *args, impl_args=None):
        """Run ``op`` on the model and every implementation; outcomes must agree in kind."""
        try:
            expected, error = getattr(self.model, op)(*args), None
        except CONTRACT_ERRORS as exc:
            expected, error = None, type(exc)
        results = {}
        for name, mgr in self.impls.items():
            try:
                got = getattr(mgr, op)(*(impl_args or args))
            except Exception as exc:
                assert error is not None, f"{name}.{op}{args} raised {exc!r}; the model succeeded"
                assert type(exc) is error, f"{name}.{op}{args} raised {type(exc).__name__}, model {error.__name__}"
                continue
            assert error is None, f"{name}.{op}{args} returned {got!r}; the model raised {error.__name__}"
            results[name] = got
        return expected, results

    @rule(seq=SEQS, tokens=TOKENS)
    def allocate(self, seq: int, tokens: int) -> None:
        self._call("allocate", seq, tokens)

    @rule(seq=SEQS, partial=st.booleans())
    def allocate_rest_of_pool(self, seq: int, partial: bool) -> None:
        """Drain the pool, so that exhaustion paths (appends, copy-on-write, steps) get exercised."""
        blocks = max(1, min(self.model.num_free_blocks(), CFG["max_blocks_per_seq"]))
        self._call("allocate", seq, blocks * CFG["block_size"] - partial)

    @rule(seq=SEQS)
    def append_slot(self, seq: int) -> None:
        expected, results = self._call("append_slot", seq)
        for name, got in results.items():
            assert (got is None) == (expected is None), f"{name}: copy-on-write {got} vs model {expected}"
            if expected is not None:
                self.maps[name].bind(expected[0], got[0])
                self.maps[name].bind(expected[1], got[1])

    @rule(parent=SEQS, child=SEQS)
    def fork(self, parent: int, child: int) -> None:
        self._call("fork", parent, child)

    @rule(seq=SEQS)
    def free(self, seq: int) -> None:
        self._call("free", seq)

    @rule(n=st.integers(-1, CFG["num_blocks"] + 1))
    def can_allocate(self, n: int) -> None:
        expected, results = self._call("can_allocate", n)
        assert all(got == expected for got in results.values()), results

    @rule(seqs=st.lists(SEQS, max_size=CFG["max_seqs"] + 1))
    def decode_step(self, seqs: list[int]) -> None:
        n = len(seqs)
        cow_out, slot_out = np.full((n, 2), -1, np.int64), np.full(n, -1, np.int64)
        ids = np.array(seqs, dtype=np.int64)
        try:
            cows, slots = self.model.decode_step(seqs)
            error = None
        except CONTRACT_ERRORS as exc:
            error = type(exc)
        for name, mgr in self.impls.items():
            try:
                ncow = mgr.decode_step(ids, cow_out, slot_out)
            except Exception as exc:
                assert error is not None and type(exc) is error, f"{name}.decode_step({seqs}): {exc!r} vs {error}"
                continue
            assert error is None, f"{name}.decode_step({seqs}) succeeded; the model raised {error.__name__}"
            assert ncow == len(cows), f"{name}: {ncow} copy-on-writes, model {len(cows)}"
            for (src, dst), (isrc, idst) in zip(cows, cow_out[:ncow].tolist(), strict=True):
                self.maps[name].bind(src, isrc)
                self.maps[name].bind(dst, idst)
            for model_slot, impl_slot in zip(slots, slot_out.tolist(), strict=True):
                self.maps[name].slot(model_slot, impl_slot, CFG["block_size"])

    @rule(seqs=st.lists(SEQS, max_size=CFG["max_seqs"]))
    def lookup(self, seqs: list[int]) -> None:
        slot_out = np.full(len(seqs), -1, np.int64)
        error = None
        try:
            slots = [self.model.last_slot(s) for s in seqs]
        except CONTRACT_ERRORS as exc:
            error = type(exc)
        for name, mgr in self.impls.items():
            try:
                mgr.lookup(np.array(seqs, dtype=np.int64), slot_out)
            except Exception as exc:
                assert error is not None and type(exc) is error, f"{name}.lookup({seqs}): {exc!r}"
                continue
            assert error is None, f"{name}.lookup({seqs}) succeeded; the model raised {error.__name__}"
            for model_slot, impl_slot in zip(slots, slot_out.tolist(), strict=True):
                self.maps[name].slot(model_slot, impl_slot, CFG["block_size"])

    @rule(seq=SEQS)
    def inspect_sequence(self, seq: int) -> None:
        for op in ("seq_len", "last_slot", "block_table"):
            expected, results = self._call(op, seq)
            if op == "seq_len":
                assert all(got == expected for got in results.values())

    @rule(block=st.integers(-1, CFG["num_blocks"]))
    def ref_count_range(self, block: int) -> None:
        if not 0 <= block < CFG["num_blocks"]:
            self._call("ref_count", block)

    @invariant()
    def same_state(self) -> None:
        model = self.model
        for name, mgr in self.impls.items():
            ids = self.maps[name]
            assert mgr.num_free_blocks() == model.num_free_blocks(), f"{name}: free count"
            for seq in range(CFG["max_seqs"]):
                if seq not in model.tables:
                    try:
                        mgr.seq_len(seq)
                    except KeyError:
                        continue
                    raise AssertionError(f"{name}: sequence {seq} should be inactive")
                assert mgr.seq_len(seq) == model.lens[seq], f"{name}: length of {seq}"
                table = list(mgr.block_table(seq))
                assert len(table) == len(model.tables[seq]), f"{name}: table length of {seq}"
                for model_id, impl_id in zip(model.tables[seq], table, strict=True):
                    ids.bind(model_id, impl_id)
            for impl_id in range(CFG["num_blocks"]):
                model_id = ids.to_model.get(impl_id)
                expected = 0 if model_id is None else model.refs[model_id]
                assert mgr.ref_count(impl_id) == expected, f"{name}: ref count of block {impl_id}"
            ids.forget_free(model.refs)


ContractMachine.TestCase.settings = settings(
    max_examples=int(__import__("os").environ.get("KVB_HYPOTHESIS_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestContract = ContractMachine.TestCase
