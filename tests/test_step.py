"""The whole-step entry point, ``step``, on every registered implementation.

It must equal the per-call methods on the same trace (statuses, copy-on-writes, slots, end state), give each
op the status code its per-call method's exception carries without stopping later ops, refuse bad buffers and
op codes before anything changes (writing nothing anywhere), and, for ``flat``, allocate nothing per step
beyond the call itself.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from harness.base.drivers import Prepared, whole_step_runner
from harness.base.replay import check_end_state
from harness.counters.allocations import count_allocations, nrt_allocations
from harness.studies.paced import paced_whole_step_run
from impls import REGISTRY, contract
from impls.core import compiled
from impls.core.compiled import CompiledBlockManager
from scenarios import generate
from tests.test_hostile_calls import Guarded, manager, snapshot

I64 = np.int64


@pytest.fixture(scope="module")
def sharing_trace():
    """A short trace with forks and copy-on-writes (parallel sampling)."""
    trace = generate("parallel-sampling", steps=40, running=32, num_blocks=2048)
    assert trace.header["cow_count"] > 0 and trace.header["ops_by_kind"].get("fork", 0) > 0
    return trace


def per_call(mgr, ops, a0, a1) -> list[int]:
    """What an engine calling the per-call methods would record: each op's status, exceptions caught."""
    out = []
    for o, x, y in zip(ops, a0, a1, strict=True):
        try:
            if o == contract.CAN_ALLOCATE:
                out.append(int(mgr.can_allocate(x)))
                continue
            if o == contract.ALLOCATE:
                mgr.allocate(x, y)
            elif o == contract.FORK:
                mgr.fork(x, y)
            else:
                mgr.free(x)
            out.append(0)
        except (ValueError, KeyError, MemoryError) as exc:
            out.append(exc.code)
    return out


def test_step_equals_the_per_call_methods_on_a_trace(impl_name: str, sharing_trace) -> None:
    prep = Prepared.from_trace(sharing_trace)
    via_step, via_calls = REGISTRY[impl_name](**sharing_trace.config), REGISTRY[impl_name](**sharing_trace.config)
    cows = np.zeros(prep.num_steps, dtype=I64)
    run = whole_step_runner(prep, via_step, cows)  # checks each step's statuses against the trace
    n = prep.max_batch
    status = np.zeros(max(m - f for f, m, _ in prep.bounds) + contract.STEP_EXTRA, I64)
    cow_a, slot_a, cow_b, slot_b = np.zeros((n, 2), I64), np.zeros(n, I64), np.zeros((n, 2), I64), np.zeros(n, I64)
    op, a0, a1 = prep.arrays64
    for s, (first, mid, end) in enumerate(prep.bounds):
        k = via_step.step(op[first:mid], a0[first:mid], a1[first:mid], prep.decode_ids[s], status, cow_a, slot_a)
        expected = per_call(via_calls, prep.op[first:mid], prep.a0[first:mid], prep.a1[first:mid])
        assert status[: mid - first].tolist() == expected and status[mid - first] == 0
        assert k == via_calls.decode_step(prep.decode_ids[s], cow_b, slot_b) == sharing_trace.step_cows[s]
        assert slot_a[: end - mid].tolist() == slot_b[: end - mid].tolist(), f"step {s}"
        assert cow_a[:k].tolist() == cow_b[:k].tolist(), f"step {s}"
    assert snapshot(via_step) == snapshot(via_calls)
    check_end_state(sharing_trace, via_step)
    run2 = REGISTRY[impl_name](**sharing_trace.config)
    run = whole_step_runner(prep, run2, cows)
    run(0, prep.num_steps)
    assert cows.tolist() == sharing_trace.step_cows.tolist()
    assert snapshot(run2) == snapshot(via_step)


# Row 0: 5 tokens; row 1: 4 tokens; row 2 forked from 1; 24 blocks of 4 tokens (21 free), 6 rows of at most 8
# blocks. Each failing op must get its code and change nothing; the ops after it still run.
FAILING_OPS = [
    (contract.ALLOCATE, 0, 3, contract.E_ACTIVE),
    (contract.FREE, 5, 0, contract.E_INACTIVE),
    (contract.FORK, 1, 7, contract.E_SEQ_RANGE),  # child out of range
    (contract.FORK, 4, 5, contract.E_INACTIVE),  # parent inactive
    (contract.ALLOCATE, 3, 0, contract.E_TOKENS),
    (contract.ALLOCATE, 3, 33, contract.E_TOO_LONG),  # 9 blocks
    (contract.ALLOCATE, 3, 2**40, contract.E_TOO_LONG),  # must not wrap around in an int32 length
    (contract.ALLOCATE, -1, 4, contract.E_SEQ_RANGE),
    (contract.CAN_ALLOCATE, -2, 0, contract.E_COUNT),
    (contract.CAN_ALLOCATE, 2**40, 0, 0),  # answered False, not an error
    (contract.ALLOCATE, 3, 32, 0),  # 13 free
    (contract.ALLOCATE, 4, 32, 0),  # 5 free
    (contract.ALLOCATE, 5, 32, contract.E_NO_BLOCKS),
    (contract.FREE, 4, 0, 0),
    (contract.FREE, 0, 0, 0),
    (contract.ALLOCATE, 0, 9, 0),  # the row freed just before
    (contract.FORK, 0, 4, 0),
    (contract.CAN_ALLOCATE, 3, 0, 1),
]


def step_buffers(m: int, n: int):
    return Guarded((m + contract.STEP_EXTRA,)), Guarded((n, 2)), Guarded((n,))


def test_each_op_is_atomic_and_a_failure_does_not_stop_later_ops(impl_name: str) -> None:
    mgr, twin = manager(impl_name), manager(impl_name)
    ops, a0, a1, expected = (np.array(c, dtype=I64) for c in zip(*FAILING_OPS, strict=True))
    m = len(ops)
    status, cow, slot = step_buffers(m, 4)
    batch = np.array([1, 2, 4], I64)  # two rows at a block boundary, and row 4 sharing row 0's partial block
    k = mgr.step(ops, a0, a1, batch, status.view, cow.view, slot.view)
    assert status.view[:m].tolist() == expected.tolist() == per_call(twin, *(x.tolist() for x in (ops, a0, a1)))
    cow2, slot2 = np.zeros((3, 2), I64), np.zeros(3, I64)
    assert k == twin.decode_step(batch, cow2, slot2) == 1
    assert status.view[m:].tolist() == [0, 0]
    assert slot.view[:3].tolist() == slot2.tolist() and cow.view[:k].tolist() == cow2[:k].tolist()
    assert snapshot(mgr) == snapshot(twin)
    assert status.outside_untouched() and cow.outside_untouched() and slot.outside_untouched()


@pytest.mark.parametrize(("batch", "code", "detail"), [([0, 1, 0], contract.E_DUPLICATE, 0),
                                                       ([0, 3], contract.E_INACTIVE, 3),
                                                       ([0, 9], contract.E_SEQ_RANGE, 9)])
def test_a_failed_decode_batch_keeps_the_ops_and_leaves_its_buffers(impl_name: str, batch, code, detail) -> None:
    mgr, twin = manager(impl_name), manager(impl_name)
    twin.free(2)
    status, cow, slot = step_buffers(1, len(batch))
    k = mgr.step(np.array([contract.FREE], I64), np.array([2], I64), np.array([0], I64), np.array(batch, I64),
                 status.view, cow.view, slot.view)
    assert k == code and status.view[:3].tolist() == [0, code, detail]
    assert cow.untouched() and slot.untouched()
    assert snapshot(mgr) == snapshot(twin)


def test_an_exhausted_pool_fails_the_batch_with_the_blocks_it_needs(impl_name: str) -> None:
    mgr = manager(impl_name)
    mgr.allocate(3, 32), mgr.allocate(4, 32), mgr.allocate(5, 20)  # 8 + 8 + 5 blocks: the pool is empty now
    before = snapshot(mgr)
    status, cow, slot = step_buffers(0, 3)
    e = np.zeros(0, I64)
    assert mgr.step(e, e, e, np.array([0, 1, 2], I64), status.view, cow.view, slot.view) == contract.E_NO_BLOCKS
    assert status.view[:2].tolist() == [contract.E_NO_BLOCKS, 2]  # row 1 at a boundary, row 2 at a boundary too
    assert snapshot(mgr) == before and cow.untouched() and slot.untouched()


def _misaligned(n: int) -> np.ndarray:
    """A writeable int64 vector one byte off an 8-byte boundary."""
    a = np.frombuffer(bytearray(8 * n + 1), dtype=I64, offset=1, count=n)
    assert not a.flags.aligned and a.flags.writeable
    return a


def _hostile_cases():
    """(name, kwargs over the good arguments) that step must refuse as a whole."""
    good_ops = np.array([contract.FREE, contract.ALLOCATE], I64)
    yield "ops not an array", {"ops": [contract.FREE, contract.ALLOCATE]}, TypeError
    yield "ops float", {"ops": good_ops.astype(float)}, TypeError
    yield "ops bool", {"ops": np.array([True, False])}, TypeError
    yield "ops 2-D", {"ops": good_ops.reshape(2, 1)}, ValueError
    yield "a0 shorter", {"a0": np.array([0], I64)}, ValueError
    yield "a1 longer", {"a1": np.array([0, 9, 9], I64)}, ValueError
    yield "uint64 beyond int64", {"a1": np.array([0, 2**63 + 5], np.uint64)}, ValueError
    yield "status_out too small", {"status_out": np.zeros(3, I64)}, ValueError
    yield "status_out read-only", {"status_out": np.zeros(8, I64)}, ValueError
    yield "status_out int32", {"status_out": np.zeros(8, np.int32)}, TypeError
    yield "status_out strided", {"status_out": np.zeros(16, I64)[::2]}, ValueError
    yield "cow_out 1-D", {"cow_out": np.zeros(6, I64)}, ValueError
    yield "slot_out too small", {"slot_out": np.zeros(1, I64)}, ValueError
    whole = np.zeros(16, I64)
    yield "status_out over slot_out", {"status_out": whole[2:10], "slot_out": whole[:3]}, ValueError
    whole = np.zeros(16, I64)
    yield "status_out over a0", {"status_out": whole[:8], "a0": whole[:2]}, ValueError
    # Plain int64 buffers that Numba's types accept: the rules below are the step kernel's to find.
    yield "cow_out 3 columns", {"cow_out": np.zeros((3, 3), I64)}, ValueError
    yield "slot_out misaligned", {"slot_out": _misaligned(3)}, ValueError
    yield "status_out big-endian", {"status_out": np.zeros(8, ">i8")}, TypeError
    whole = np.array([0, 0, 0, 0, 0, 1, 2, 0], I64)  # valid ids at 5 and 6: only the overlap is wrong
    yield "cow_out over seq_ids", {"cow_out": whole[:6].reshape(3, 2), "seq_ids": whole[5:7]}, ValueError
    whole = np.array([0, 0, contract.FREE, contract.ALLOCATE, 0], I64)  # valid ops at 2 and 3
    yield "slot_out over ops", {"slot_out": whole[:3], "ops": whole[2:4]}, ValueError
    for code in (contract.APPEND, contract.ALLOCATE_CACHED, contract.SEAL, 7, -1):
        yield f"op code {code}", {"ops": np.array([contract.FREE, code], I64)}, ValueError


@pytest.mark.parametrize(("case", "change", "exc"), list(_hostile_cases()), ids=[c[0] for c in _hostile_cases()])
def test_bad_arguments_are_refused_before_anything_changes(impl_name: str, case, change, exc) -> None:
    mgr = manager(impl_name)
    before = snapshot(mgr)
    status, cow, slot = step_buffers(2, 3)
    args = {"ops": np.array([contract.FREE, contract.ALLOCATE], I64), "a0": np.array([0, 0], I64),
            "a1": np.array([0, 6], I64),
            "seq_ids": np.array([1, 2], I64), "status_out": status.view, "cow_out": cow.view, "slot_out": slot.view}
    args.update(change)
    if case == "status_out read-only":
        args["status_out"].flags.writeable = False
    with pytest.raises(exc):
        mgr.step(**args)
    assert snapshot(mgr) == before
    assert cow.untouched() and slot.untouched()
    assert case.startswith("status_out") or status.untouched()


def test_the_reserved_codes_say_what_they_are() -> None:
    mgr = manager("flat")
    status, cow, slot = step_buffers(1, 1)
    e = np.zeros(0, I64)
    with pytest.raises(ValueError, match="prefix-caching ops are reserved"):
        mgr.step(np.array([contract.SEAL], I64), np.array([0], I64), np.array([1], I64), e, status.view, cow.view,
                 slot.view)
    with pytest.raises(ValueError, match="decode appends go in seq_ids"):
        mgr.step(np.array([contract.APPEND], I64), np.array([0], I64), np.array([0], I64), e, status.view, cow.view,
                 slot.view)


@pytest.mark.parametrize("counter", [count_allocations, nrt_allocations])
def test_flat_step_allocates_nothing_beyond_the_call(counter) -> None:
    """K whole steps with pool operations (an admission, a fork, their frees) and a decode batch of 64 rows,
    against K steps with neither, through the same call."""
    seqs, k = 64, 200
    mgr = REGISTRY["flat"](num_blocks=8192, block_size=16, max_seqs=seqs + 2, max_blocks_per_seq=128)
    for seq in range(seqs):
        mgr.allocate(seq, 1 + 7 * seq)  # varied lengths: block boundaries fall on different steps
    ops = np.array([contract.ALLOCATE, contract.CAN_ALLOCATE, contract.FORK, contract.FREE, contract.FREE], I64)
    a0, a1 = np.array([seqs, 4, seqs, seqs + 1, seqs], I64), np.array([17, 0, seqs + 1, 0, 0], I64)
    ids = np.arange(seqs, dtype=I64)
    status, cow, slot = np.zeros(8, I64), np.zeros((seqs, 2), I64), np.zeros(seqs, I64)
    e = ids[:0]

    def step():
        mgr.step(ops, a0, a1, ids, status, cow, slot)

    def empty_step():
        mgr.step(e, e, e, e, status, cow, slot)

    for _ in range(3):  # compile and warm outside the counted region
        step(), empty_step()
    assert status[:2].tolist() == [0, 0]  # (the empty step's batch status)
    step()
    assert status[:7].tolist() == [0, 1, 0, 0, 0, 0, 0]
    counter(step, 2), counter(empty_step, 2)  # the counters' own first-use allocations
    assert counter(step, k) == counter(empty_step, k)


def test_the_paced_run_calls_step_once_per_step_and_checks_it(sharing_trace) -> None:
    prep = Prepared.from_trace(sharing_trace)
    calls = []

    def make():
        mgr = REGISTRY["flat"](**sharing_trace.config)
        step = mgr.step
        mgr.step = lambda *args: calls.append(1) or step(*args)
        return mgr

    result = paced_whole_step_run(prep, make, rate=4000)
    assert result.steps == len(calls) == prep.num_steps and result.deadline_misses >= 0


def _compiled_names() -> list[str]:
    return sorted(n for n in REGISTRY if issubclass(REGISTRY[n], CompiledBlockManager))


@pytest.mark.parametrize("impl_name", _compiled_names())
def test_usual_buffers_never_reach_the_python_checks(impl_name: str, monkeypatch) -> None:
    """Plain int64 buffers, views included, are checked by Numba's types and the kernel alone: the compiled
    step's cheap path is the one an engine takes (a regression here costs every engine step microseconds)."""
    mgr = manager(impl_name)
    status, cow, slot = step_buffers(2, 3)

    def refuse(*args, **kwargs):
        raise AssertionError("step_args called for usual buffers")

    monkeypatch.setattr(compiled, "step_args", refuse)
    assert mgr.step(np.array([contract.FREE, contract.ALLOCATE], I64), np.array([0, 0], I64), np.array([0, 6], I64),
                    np.array([1, 2], I64), status.view, cow.view, slot.view) >= 0


# Read-only inputs make Numba compile another version of each design's step loop (up to 25 s with a cold
# cache): one design shows the shared path (CompiledBlockManager.step), the other forms run on every design.
_FORMS = ("big-endian inputs", "subclass", "read-only inputs", "int32 inputs", "empty ids inside slot_out")
_UNUSUAL = [(name, form) for name in _compiled_names() for form in _FORMS
            if form != "read-only inputs" or name == "flat"]


@pytest.mark.parametrize(("impl_name", "form"), _UNUSUAL, ids=[f"{f}-{n}" for n, f in _UNUSUAL])
def test_unusual_buffers_give_the_usual_result(impl_name: str, form: str) -> None:
    """Buffers off the cheap path (converted, or typed otherwise by Numba) give what plain int64 ones give; in
    particular big-endian ids, which Numba would type as int64, are never read in the wrong byte order."""
    plain = [np.array(v, I64) for v in ([contract.FREE, contract.ALLOCATE], [0, 0], [0, 6], [1, 2])]
    usual, other = manager(impl_name), manager(impl_name)
    status, cow, slot = (g.view for g in step_buffers(2, 3))
    if form == "big-endian inputs":
        args = [x.astype(">i8") for x in plain]
    elif form == "subclass":
        args = [x.view(_Sub) for x in plain]
    elif form == "read-only inputs":
        args = [x.copy() for x in plain]
        for x in args:
            x.flags.writeable = False
    elif form == "int32 inputs":
        args = [x.astype(np.int32) for x in plain]
    else:  # no memory in common with slot_out, though its address lies inside (as np.may_share_memory says)
        plain[3] = plain[3][:0]
        args = [*plain[:3], slot[1:1]]
    want = usual.step(*plain, *(g.view for g in step_buffers(2, 3)))
    assert other.step(*args, status, cow, slot) == want
    assert snapshot(other) == snapshot(usual)


class _Sub(np.ndarray):
    """An ndarray subclass, as a user's wrapper might be."""


_BYTE_ORDER_PROBE = """
import numpy as np
from impls import REGISTRY
mgr = REGISTRY["flat"](max_seqs=8, num_blocks=64, block_size=4, max_blocks_per_seq=8)
ops, a0, a1, ids = (np.array(v, np.int64) for v in ([1], [0], [6], [0]))  # allocate row 0, then decode it
unaligned = np.frombuffer(bytearray(9), dtype=np.int64, offset=1, count=1)
unaligned[:] = ids
mgr.step(ops, a0, a1, unaligned, np.zeros(3, np.int64), np.zeros((1, 2), np.int64), np.zeros(1, np.int64))
big = [x.astype(">i8") for x in (ops, a0, a1, ids)]
other = REGISTRY["flat"](max_seqs=8, num_blocks=64, block_size=4, max_blocks_per_seq=8)
status = np.ones(3, np.int64)
other.step(*big, status, np.zeros((1, 2), np.int64), np.zeros(1, np.int64))
print(status.tolist(), other.seq_len(0))
"""


def test_big_endian_buffers_are_read_in_their_byte_order_after_unaligned_ones() -> None:
    """Numba 0.68's dispatcher, once it has typed an unaligned int64 array, types a big-endian one as native
    int64 (found here: which of the two it sees first decides both), so the compiled step checks byte order
    itself. Run in a fresh interpreter, where the unaligned array comes first for certain."""
    out = subprocess.run([sys.executable, "-c", _BYTE_ORDER_PROBE], capture_output=True, text=True, check=False,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[0,", "0,", "0]", "7"]  # allocated, decoded: 6 + 1 tokens


def test_entry_points_are_compiled_once_per_kernel_and_signature_not_per_manager() -> None:
    """A fresh manager binds its state to the entry points found before (no per-instance lookup in Numba)."""
    from impls.designs.flat import FlatBlockManager

    a, b = FlatBlockManager(64, 16, 4, 8), FlatBlockManager(64, 16, 4, 8)
    for op in ("_ep_allocate", "_ep_can_allocate", "_ep_append", "_ep_free", "_ep_last_slot", "_ep_fork"):
        assert getattr(a, op).func is getattr(b, op).func, op
    assert a._ep_allocate.args[0] is a.state[0]  # bound to its own state
    wide = FlatBlockManager(70_000, 16, 4, 8)  # uint32 ids: another signature, another entry point
    assert wide._ep_allocate.func is not a._ep_allocate.func
