"""Hostile calls against every registered implementation: wrong types, wrong buffers, overflowing values.

Each case must raise the contract's exception type, leave the state exactly as it was (free count, every
block's ref count, every row's table and length) and write nothing outside the buffers it was given: outputs
are views into larger sentinel-filled arrays, and everything around the view must still hold the sentinel.
"""

from __future__ import annotations

import numpy as np
import pytest

import impls.core.validation
from impls import REGISTRY
from impls.contract import MAX_NUM_BLOCKS, MAX_SEQ_TOKENS, MAX_SEQS
from tests.registered import impl_params, slow_for

NUM_BLOCKS, BLOCK_SIZE, MAX_SEQS_T, MAX_BLOCKS = 24, 4, 6, 8  # at most 32 tokens per sequence
SENTINEL = -7777
N = 3  # the decode batch [0, 1, 2]


def manager(name: str):
    """Row 0: 5 tokens (partial block); row 1: 4 tokens (at a boundary); row 2 forked from 1 (shared blocks)."""
    mgr = REGISTRY[name](num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_seqs=MAX_SEQS_T,
                         max_blocks_per_seq=MAX_BLOCKS)
    mgr.allocate(0, 5)
    mgr.allocate(1, 4)
    mgr.fork(1, 2)
    return mgr


def snapshot(mgr) -> tuple:
    rows = []
    for seq in range(mgr.max_seqs):
        try:
            rows.append((mgr.seq_len(seq), list(mgr.block_table(seq))))
        except KeyError:
            rows.append(None)
    return mgr.num_free_blocks(), [mgr.ref_count(b) for b in range(mgr.num_blocks)], rows


class Guarded:
    """A sentinel-filled int64 array with a margin on each side; ``view`` is what a call is given."""

    def __init__(self, shape: tuple[int, ...], *, margin: int = 8, dtype=np.int64) -> None:
        size = int(np.prod(shape))
        self.sentinel = np.array(SENTINEL).astype(dtype)  # wrapped to the dtype (uint8, bool, ...)
        self.whole = np.full(size + 2 * margin, self.sentinel, dtype=dtype)
        self.margin, self.size = margin, size
        self.view = self.whole[margin : margin + size].reshape(shape)

    def outside_untouched(self) -> bool:
        m, s = self.margin, self.size
        return bool((self.whole[:m] == self.sentinel).all() and (self.whole[m + s :] == self.sentinel).all())

    def untouched(self) -> bool:
        return bool((self.whole == self.sentinel).all())


def ids(*values, dtype=np.int64) -> np.ndarray:
    return np.array(values, dtype=dtype)


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# -- decode_step and lookup buffers ---------------------------------------------------------------------------
# Each case: (cow_out, slot_out) builders, expected error. Every buffer is a Guarded view (or a plain object);
# after the call every Guarded array must be untouched: a failed step writes nothing at all.


def _cow(shape=(N, 2), **kw):
    return lambda: Guarded(shape, **kw)


def _slot(shape=(N,), **kw):
    return lambda: Guarded(shape, **kw)


def _raw(make):
    return lambda: make()


BAD_BUFFERS = {
    # the issue's (1, 1) view: big[:1].reshape(1, 1) as cow_out
    "cow (1,1) view": (_cow((1, 1)), _slot(), ValueError),
    "cow (n,1)": (_cow((N, 1)), _slot(), ValueError),
    "cow (n,3)": (_cow((N, 3)), _slot(), ValueError),
    "cow 1-D": (_cow((2 * N,)), _slot(), ValueError),
    "cow 3-D": (_cow((N, 2, 1)), _slot(), ValueError),
    "cow too few rows": (_cow((N - 1, 2)), _slot(), ValueError),
    "cow uint8": (_cow(dtype=np.uint8), _slot(), TypeError),
    "cow int8": (_cow(dtype=np.int8), _slot(), TypeError),
    "cow int32": (_cow(dtype=np.int32), _slot(), TypeError),
    "cow uint64": (_cow(dtype=np.uint64), _slot(), TypeError),
    "cow float64": (_cow(dtype=np.float64), _slot(), TypeError),
    "cow big-endian": (_cow(dtype=np.dtype(">i8")), _slot(), TypeError),
    "slot (1,1) view": (_cow(), _slot((1, 1)), ValueError),
    "slot (n,1)": (_cow(), _slot((N, 1)), ValueError),
    "slot too short": (_cow(), _slot((N - 1,)), ValueError),
    "slot 0-d": (_cow(), _slot(()), ValueError),
    "slot uint8": (_cow(), _slot(dtype=np.uint8), TypeError),
    "slot int8": (_cow(), _slot(dtype=np.int8), TypeError),
    "slot int16": (_cow(), _slot(dtype=np.int16), TypeError),
    "slot int32": (_cow(), _slot(dtype=np.int32), TypeError),
    "slot uint32": (_cow(), _slot(dtype=np.uint32), TypeError),
    "slot uint64": (_cow(), _slot(dtype=np.uint64), TypeError),
    "slot float64": (_cow(), _slot(dtype=np.float64), TypeError),
    "slot bool": (_cow(), _slot(dtype=np.bool_), TypeError),
}


def _strided_cow():
    g = Guarded((2 * N, 2))
    return g, g.view[::2]


def _fortran_cow():
    g = Guarded((N, 2))
    return g, np.asfortranarray(g.view)


def _strided_slot():
    g = Guarded((2 * N,))
    return g, g.view[::2]


def _read_only(shape):
    def make():
        g = Guarded(shape)
        return g, read_only(g.view.view())
    return make


def _plain(shape):
    def make():
        g = Guarded(shape)
        return g, g.view
    return make


# (cow maker, slot maker, error): makers return (Guarded or None, the object passed)
SPECIAL_BUFFERS = {
    "cow strided rows": (_strided_cow, _plain((N,)), ValueError),
    "cow Fortran order": (_fortran_cow, _plain((N,)), ValueError),
    "cow read-only": (_read_only((N, 2)), _plain((N,)), ValueError),
    "cow list": (lambda: (None, [[0, 0]] * N), _plain((N,)), TypeError),
    "cow None": (lambda: (None, None), _plain((N,)), TypeError),
    "slot strided": (_plain((N, 2)), _strided_slot, ValueError),
    "slot read-only": (_plain((N, 2)), _read_only((N,)), ValueError),
    "slot list": (_plain((N, 2)), lambda: (None, [0] * N), TypeError),
}


def each_case(impl_name: str, cases: dict, check) -> None:
    """Run ``check(impl_name, case, *cases[case])`` for every case (one test per table keeps the suite fast);
    report every failing case by name."""
    failures = []
    for case in sorted(cases):
        try:
            check(impl_name, case, *cases[case])
        except (AssertionError, pytest.fail.Exception, Exception) as exc:  # reported below, by case
            failures.append(f"{case}: {type(exc).__name__}: {exc}".splitlines()[0])
    assert not failures, f"{impl_name}: {len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)


def test_decode_step_rejects_bad_buffers(impl_name: str) -> None:
    each_case(impl_name, BAD_BUFFERS, _check_bad_buffers)


def _check_bad_buffers(impl_name: str, case: str, cow_make, slot_make, error) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    cow, slot = cow_make(), slot_make()
    with pytest.raises(error):
        mgr.decode_step(ids(0, 1, 2), cow.view, slot.view)
    assert snapshot(mgr) == before
    assert cow.untouched() and slot.untouched()


def test_decode_step_rejects_special_buffers(impl_name: str) -> None:
    each_case(impl_name, SPECIAL_BUFFERS, _check_special_buffers)


def _check_special_buffers(impl_name: str, case: str, cow_make, slot_make, error) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    (cow_g, cow), (slot_g, slot) = cow_make(), slot_make()
    with pytest.raises(error):
        mgr.decode_step(ids(0, 1, 2), cow, slot)
    assert snapshot(mgr) == before
    assert all(g is None or g.untouched() for g in (cow_g, slot_g))


def test_the_issue_one_by_one_cow_view(impl_name: str) -> None:
    """``big[:1].reshape(1, 1)`` as cow_out for one sequence whose step copies: nothing written to big[1]."""
    mgr = manager(impl_name)
    mgr.allocate(3, 2)
    mgr.fork(3, 4)  # row 3's last block is shared and partial: its next append is a copy-on-write
    before = snapshot(mgr)
    big = np.full(4, SENTINEL, dtype=np.int64)
    with pytest.raises(ValueError):
        mgr.decode_step(ids(3), big[:1].reshape(1, 1), np.zeros(1, np.int64))
    assert (big == SENTINEL).all() and snapshot(mgr) == before


BAD_IDS = {
    "float64": (lambda: ids(0, 1, 2, dtype=np.float64), TypeError),
    "float32": (lambda: ids(0, 1, 2, dtype=np.float32), TypeError),
    "bool": (lambda: ids(True, False, dtype=np.bool_), TypeError),
    "object": (lambda: ids(0, 1, 2, dtype=object), TypeError),
    "str": (lambda: np.array(["0", "1"]), TypeError),
    "list": (lambda: [0, 1, 2], TypeError),
    "None": (lambda: None, TypeError),
    "2-D": (lambda: ids(0, 1, 2).reshape(3, 1), ValueError),
    "0-d": (lambda: np.array(0), ValueError),
    "uint64 max": (lambda: ids(0, 2**64 - 1, dtype=np.uint64), ValueError),
    "uint64 2**63": (lambda: ids(2**63, dtype=np.uint64), ValueError),
    "int64 min": (lambda: ids(0, -(2**63)), ValueError),
    "int8 -1": (lambda: ids(0, -1, dtype=np.int8), ValueError),
    "int32 max": (lambda: ids(0, 2**31 - 1, dtype=np.int32), ValueError),
    "uint16 max": (lambda: ids(0, 2**16 - 1, dtype=np.uint16), ValueError),
    "out of range": (lambda: ids(0, MAX_SEQS_T), ValueError),
    "inactive": (lambda: ids(0, 5), KeyError),
    "duplicate": (lambda: ids(0, 1, 0), ValueError),
}


def test_decode_step_and_lookup_reject_bad_ids(impl_name: str) -> None:
    each_case(impl_name, BAD_IDS, _check_bad_ids)


def _check_bad_ids(impl_name: str, case: str, make, error) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    cow, slot = Guarded((N, 2)), Guarded((N,))
    with pytest.raises(error):
        mgr.decode_step(make(), cow.view, slot.view)
    assert snapshot(mgr) == before and cow.untouched() and slot.untouched()
    if case == "duplicate":  # a lookup may name a sequence twice
        return
    with pytest.raises(error):
        mgr.lookup(make(), slot.view)
    # A failed lookup changes no state; compiled lookups may have written the slots of the ids before the
    # failing one (inside slot_out: the kernel checks as it goes, to keep lookups one pass), never outside.
    assert snapshot(mgr) == before and slot.outside_untouched()


def test_overlapping_buffers_are_refused(impl_name: str) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    g = Guarded((4 * N,))
    buf = g.view
    cases = [
        (ids(0, 1, 2), buf[: 2 * N].reshape(N, 2), buf[N : 2 * N]),  # slot inside cow
        (buf[N : 2 * N], buf[: 2 * N].reshape(N, 2), np.zeros(N, np.int64)),  # a CoW pair would rewrite ids
        (buf[:N], np.zeros((N, 2), np.int64), buf[1 : N + 1]),  # each slot would rewrite the next id
    ]
    buf[:N] = buf[N : 2 * N] = [0, 1, 2]
    for seq_ids, cow, slot in cases:
        kept = g.whole.copy()
        with pytest.raises(ValueError, match="overlap"):
            mgr.decode_step(seq_ids, cow, slot)
        assert (g.whole == kept).all() and snapshot(mgr) == before
    with pytest.raises(ValueError, match="overlap"):
        mgr.lookup(buf[:N], buf[1 : N + 1])
    assert snapshot(mgr) == before


LOOKUP_BUFFERS = {
    "(1,1) view": (lambda g: g.view[:1].reshape(1, 1), ValueError),
    "(n,1)": (lambda g: g.view[:N].reshape(N, 1), ValueError),
    "too short": (lambda g: g.view[: N - 1], ValueError),
    "strided": (lambda g: g.view[::2], ValueError),
    "read-only": (lambda g: read_only(g.view[:N]), ValueError),
    "int32": (lambda g: g.view[:N].view(np.int32)[:N], TypeError),
    "uint8": (lambda g: g.view[:N].view(np.uint8)[:N], TypeError),
    "uint64": (lambda g: g.view[:N].view(np.uint64), TypeError),
    "list": (lambda g: [0] * N, TypeError),
}


def test_lookup_rejects_bad_slot_out(impl_name: str) -> None:
    each_case(impl_name, LOOKUP_BUFFERS, _check_lookup_buffers)


def _check_lookup_buffers(impl_name: str, case: str, make, error) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    g = Guarded((2 * N,))
    with pytest.raises(error):
        mgr.lookup(ids(0, 1, 2), make(g))
    assert snapshot(mgr) == before and g.untouched()


def test_valid_views_and_id_dtypes_are_accepted(impl_name: str) -> None:
    """Exactly sized views inside guarded arrays work, for ids of every integer dtype, and write only them."""
    slots = None
    for dtype in (np.int64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.uint64):
        mgr = manager(impl_name)
        cow, slot, looked = Guarded((N, 2)), Guarded((N,)), Guarded((N,))
        ncow = mgr.decode_step(ids(0, 1, 2, dtype=dtype), cow.view, slot.view)
        assert ncow == 0 and cow.outside_untouched() and slot.outside_untouched()
        mgr.lookup(ids(0, 1, 2, dtype=dtype)[::-1], looked.view)  # a strided id view is fine (read-only)
        assert looked.view.tolist() == slot.view.tolist()[::-1] and looked.outside_untouched()
        assert slots is None or slot.view.tolist() == slots
        slots = slot.view.tolist()
    mgr = manager(impl_name)
    mgr.allocate(3, 2)
    mgr.fork(3, 4)
    cow, slot = Guarded((1, 2)), Guarded((1,))
    assert mgr.decode_step(ids(3), cow.view, slot.view) == 1  # a copy-on-write into an exact (1, 2) view
    assert cow.outside_untouched() and slot.outside_untouched()
    assert mgr.decode_step(ids(), Guarded((0, 2)).view, Guarded((0,)).view) == 0


# -- scalar arguments -----------------------------------------------------------------------------------------
INT_TYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
HUGE = (2**31, 2**31 - 1 + 2**31, 2**63 - 1, 2**63 - 8, 2**63, 2**64 - 1, 2**64, 2**100)


def _scalar_cases() -> dict[str, tuple]:
    cases: dict[str, tuple] = {}
    wrong = {"float": 1.5, "float-int": 1.0, "None": None, "bool": True, "np.bool_": np.bool_(True), "str": "1",
             "np.float64": np.float64(1.0), "array": np.array([1]), "complex": 1j}
    for label, v in wrong.items():
        cases[f"allocate(3, {label})"] = (lambda m, v=v: m.allocate(3, v), TypeError)
        cases[f"allocate({label}, 4)"] = (lambda m, v=v: m.allocate(v, 4), TypeError)
        cases[f"append_slot({label})"] = (lambda m, v=v: m.append_slot(v), TypeError)
        cases[f"fork(1, {label})"] = (lambda m, v=v: m.fork(1, v), TypeError)
        cases[f"fork({label}, 3)"] = (lambda m, v=v: m.fork(v, 3), TypeError)
        cases[f"free({label})"] = (lambda m, v=v: m.free(v), TypeError)
        cases[f"can_allocate({label})"] = (lambda m, v=v: m.can_allocate(v), TypeError)
        cases[f"ref_count({label})"] = (lambda m, v=v: m.ref_count(v), TypeError)
        for op in ("last_slot", "seq_len", "block_table", "table_nbytes"):
            cases[f"{op}({label})"] = (lambda m, v=v, op=op: getattr(m, op)(v), TypeError)
    # The issue's overflow values, as Python ints and NumPy scalars: ranges are checked before any arithmetic.
    for v in (*HUGE, np.int32(2**31 - 1), np.int64(2**63 - 8), np.int64(2**63 - 1), np.uint64(2**64 - 1),
              np.uint64(2**63), np.uint32(2**32 - 1)):
        label = f"{type(v).__name__}({int(v)})"
        cases[f"allocate(3, {label})"] = (lambda m, v=v: m.allocate(3, v), ValueError)
        cases[f"allocate({label}, 4)"] = (lambda m, v=v: m.allocate(v, 4), ValueError)
        cases[f"append_slot({label})"] = (lambda m, v=v: m.append_slot(v), ValueError)
        cases[f"fork(1, {label})"] = (lambda m, v=v: m.fork(1, v), ValueError)
        cases[f"free({label})"] = (lambda m, v=v: m.free(v), ValueError)
        cases[f"ref_count({label})"] = (lambda m, v=v: m.ref_count(v), ValueError)
        cases[f"last_slot({label})"] = (lambda m, v=v: m.last_slot(v), ValueError)
    for v in (-1, -(2**31), -(2**63), -(2**64), np.int64(-(2**63)), np.int8(-128)):
        label = f"{type(v).__name__}({int(v)})"
        cases[f"allocate(3, {label})"] = (lambda m, v=v: m.allocate(3, v), ValueError)
        cases[f"allocate({label}, 4)"] = (lambda m, v=v: m.allocate(v, 4), ValueError)
        cases[f"can_allocate({label})"] = (lambda m, v=v: m.can_allocate(v), ValueError)
        cases[f"ref_count({label})"] = (lambda m, v=v: m.ref_count(v), ValueError)
        cases[f"seq_len({label})"] = (lambda m, v=v: m.seq_len(v), ValueError)
    # NumPy integers of every width at their boundaries
    for t in INT_TYPES:
        info = np.iinfo(t)
        cases[f"allocate(3, {t.__name__} max)"] = (lambda m, t=t, i=info: m.allocate(3, t(i.max)), ValueError)
        cases[f"allocate({t.__name__} max, 4)"] = (lambda m, t=t, i=info: m.allocate(t(i.max), 4), ValueError)
        cases[f"append_slot({t.__name__} max)"] = (lambda m, t=t, i=info: m.append_slot(t(i.max)), ValueError)
        cases[f"allocate(3, {t.__name__} min)"] = (lambda m, t=t, i=info: m.allocate(3, t(i.min)), ValueError)
        if info.min < 0:
            cases[f"free({t.__name__} min)"] = (lambda m, t=t, i=info: m.free(t(i.min)), ValueError)
        cases[f"allocate(3, {t.__name__} 33)"] = (lambda m, t=t: m.allocate(3, t(33)), ValueError)  # 9 blocks
        cases[f"allocate({t.__name__} 0, 4)"] = (lambda m, t=t: m.allocate(t(0), 4), KeyError)  # row 0 active
    return cases


SCALAR_CASES = _scalar_cases()


def test_hostile_scalar_arguments(impl_name: str) -> None:
    each_case(impl_name, SCALAR_CASES, _check_scalar)


def _check_scalar(impl_name: str, case: str, call, error) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    with pytest.raises(error) as info:
        call(mgr)
    assert type(info.value) is error, f"{case}: {info.value!r}"
    assert snapshot(mgr) == before


def test_numpy_integers_of_every_width_work(impl_name: str) -> None:
    """NumPy integers are accepted wherever an int is, and act as the same Python int."""
    for t in INT_TYPES:
        mgr = manager(impl_name)
        mgr.allocate(t(3), t(32))  # the longest prompt: 8 blocks of 4
        assert mgr.seq_len(t(3)) == 32 and type(mgr.seq_len(t(3))) is int
        assert mgr.can_allocate(t(0)) and not mgr.can_allocate(t(min(np.iinfo(t).max, 2**40)))
        mgr.fork(t(0), t(4))
        assert mgr.append_slot(t(4)) is not None  # copy-on-write of row 0's shared partial block
        assert mgr.ref_count(t(0)) >= 1 and mgr.last_slot(t(4)) >= 0 and mgr.block_table(t(4))
        mgr.free(t(4))
        mgr.free(t(3))
        assert mgr.num_free_blocks() == NUM_BLOCKS - 3  # rows 0-2 hold 3 blocks


def test_huge_counts_are_answered_not_raised(impl_name: str) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    for n in (2**31, 2**63 - 1, 2**63, 2**64, 2**100, np.uint64(2**64 - 1), np.int64(2**63 - 1)):
        assert mgr.can_allocate(n) is False
    assert snapshot(mgr) == before


# -- configuration caps and memory ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": 8, "block_size": 2**48},  # the issue's huge block_size: slots would go negative
        {"num_blocks": 8, "block_size": 2**31},
        {"num_blocks": 8, "block_size": 2**30, "max_blocks_per_seq": 2},
        {"num_blocks": 8, "block_size": 2**20, "max_blocks_per_seq": 2**11},  # 2**31 tokens
        {"num_blocks": 8, "block_size": 16, "max_blocks_per_seq": 2**27},
        {"num_blocks": np.uint64(2**64 - 1)},
        {"num_blocks": MAX_NUM_BLOCKS + 1},
        {"num_blocks": 8, "max_seqs": MAX_SEQS + 1},
        {"num_blocks": 8, "block_size": np.int64(2**62), "max_blocks_per_seq": np.int64(4)},  # wraps in int64
        {"num_blocks": True},
        {"num_blocks": 8, "block_size": 4.0},
    ],
)
def test_caps_are_enforced_at_construction(impl_name: str, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        REGISTRY[impl_name](**kwargs)


def _built_or_refused(impl_name: str, **config: int):
    """The manager, or a skip when its design needs more than 2 GiB for the configuration (a design whose rows
    hold a slot per token, as SGLang's ``req_to_token``, refuses huge blocks up front); the test-suite never
    fills this machine's memory."""
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(impls.core.validation, "available_memory", lambda: 2 * 2**30)
            return REGISTRY[impl_name](**config)
    except MemoryError as exc:
        assert "GiB" in str(exc)  # the design's own estimate, before any allocation
        pytest.skip(f"{impl_name} refuses it for memory, as it must: {exc}")


# nano-vllm keeps a block's token ids as a list: a 2**30-token block takes about 17 GB and 30 s
@pytest.mark.parametrize("impl_name", slow_for(impl_params(), {"nano-vllm"}))
def test_largest_block_size_gives_exact_int64_slots(impl_name: str) -> None:
    """block_size 2**30 with one block per sequence is the cap: lengths fit int32, slots int64, exactly."""
    assert 2**30 * 1 <= MAX_SEQ_TOKENS < 2**30 * 2
    mgr = _built_or_refused(impl_name, num_blocks=4, block_size=2**30, max_seqs=2, max_blocks_per_seq=1)
    mgr.allocate(0, 2**30 - 1)
    mgr.append_slot(0)
    block = mgr.block_table(0)[0]
    assert mgr.seq_len(0) == 2**30 and mgr.last_slot(0) == block * 2**30 + 2**30 - 1
    before = snapshot(mgr)
    for call in (lambda: mgr.append_slot(0), lambda: mgr.allocate(1, 2**30 + 1), lambda: mgr.allocate(1, 2**31)):
        with pytest.raises(ValueError):
            call()
        assert snapshot(mgr) == before
    slot = Guarded((1,))
    with pytest.raises(ValueError):  # the row is full: the step is refused as a whole
        mgr.decode_step(ids(0), Guarded((1, 2)).view, slot.view)
    assert snapshot(mgr) == before and slot.untouched()


def test_the_issue_block_size_2_20(impl_name: str) -> None:
    """flat took allocate(0, 2**31) into an int32 length of -2**31: now a range error."""
    mgr = _built_or_refused(impl_name, num_blocks=8, block_size=2**20, max_seqs=2, max_blocks_per_seq=2047)
    before = snapshot(mgr)
    for n in (2**31, 2**31 - 1, np.int64(2**31), np.uint32(2**32 - 1)):
        with pytest.raises(ValueError):
            mgr.allocate(0, n)
        assert snapshot(mgr) == before
    mgr.allocate(0, 2**21 + 1)
    assert mgr.seq_len(0) == 2**21 + 1 and len(mgr.block_table(0)) == 3


def test_num_blocks_too_large_for_memory(impl_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented maximum pool needs GiBs: with 64 MiB available every design refuses it up front."""
    monkeypatch.setattr(impls.core.validation, "available_memory", lambda: 64 * 2**20)
    with pytest.raises(MemoryError, match="GiB"):
        REGISTRY[impl_name](num_blocks=MAX_NUM_BLOCKS)
    REGISTRY[impl_name](num_blocks=1024)  # small pools still fit


def test_configuration_beyond_this_machine(impl_name: str) -> None:
    """Without patching: 2**31 - 1 blocks and 2**31 - 1 rows need more than 40 GiB in every design."""
    available = impls.core.validation.available_memory()
    if available is None or available > 40 * 2**30:
        pytest.skip("this machine may hold it")
    with pytest.raises(MemoryError):
        REGISTRY[impl_name](num_blocks=MAX_NUM_BLOCKS, max_seqs=MAX_SEQS, max_blocks_per_seq=1)


def test_flat_memory_estimate_is_what_it_allocates() -> None:
    for num_blocks in (100, 65536, 65537):
        mgr = REGISTRY["flat"](num_blocks=num_blocks, max_seqs=16, max_blocks_per_seq=64)
        # the arrays it keeps, plus the int32 ids the stack is filled from during construction
        assert mgr.memory_bytes() == mgr.table.nbytes + mgr.ints.nbytes + 4 * num_blocks
    per_block = REGISTRY["flat"](num_blocks=2).memory_bytes() - REGISTRY["flat"](num_blocks=1).memory_bytes()
    assert per_block == 12
