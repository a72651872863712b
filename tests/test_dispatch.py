"""The per-call regime's dispatch: cached entry points for the manager's own arrays, and the dispatch floor
(empty kernels through the same wrappers) reported apart from the data structure's work."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

from harness.studies.dispatch import OPS, calls_per_trace, dispatch_rows, empty_call_ns, has_dispatch
from impls import REGISTRY
from impls.core.compiled import with_empty_kernels
from scenarios import generate
from tests.test_hostile_calls import manager, snapshot

COMPILED = [name for name, cls in REGISTRY.items() if has_dispatch(cls)]


def test_the_compiled_designs_are_the_ones_with_dispatch() -> None:
    assert {"flat", "dict-jit", "list-jit"} <= set(COMPILED)
    assert not {"dict", "list", "vllm-v1", "nano-vllm"} & set(COMPILED)


@pytest.mark.parametrize("name", COMPILED)
def test_per_call_methods_enter_compiled_code_without_the_dispatcher(name: str) -> None:
    mgr = manager(name)
    mgr.append_slot(0)
    for op in ("can_allocate", "allocate", "append", "fork", "free", "last_slot"):
        bound = getattr(mgr, "_ep_" + op)
        assert not isinstance(bound.func, CPUDispatcher), op  # an entry point, bound to the manager's state
        assert bound.args == tuple(mgr.state)
    old = mgr._ep_append
    mgr.state = mgr.state  # a replaced state is bound again
    assert mgr._ep_append is not old and mgr._ep_append.args == tuple(mgr.state)
    assert mgr.append_slot(0) is None and mgr.seq_len(0) == 7


@pytest.mark.parametrize("name", COMPILED)
def test_empty_calls_do_no_work_and_cost_something(name: str) -> None:
    mgr = manager(name)
    before = snapshot(mgr)
    per_op = empty_call_ns(mgr, calls=20, repeats=2)
    assert set(per_op) == set(OPS) and all(ns > 0 for ns in per_op.values())
    assert snapshot(mgr) == before  # the empty copy shares the state and never touched it
    assert with_empty_kernels(mgr).last_slot(0) == 0 and mgr.last_slot(0) == (mgr.block_table(0)[1] << 2) | 0


def test_dispatch_rows_weigh_each_operation_by_its_calls() -> None:
    trace = generate("parallel-sampling", steps=20, running=16, num_blocks=1024)
    calls = calls_per_trace(trace)
    kinds = trace.header["ops_by_kind"]
    assert calls["fork"] == kinds.get("fork", 0) > 0 and calls["allocate"] == kinds.get("allocate", 0)
    assert calls["append_slot"] == calls["last_slot"] == int(trace.running_per_step().sum())
    per_op = {op: float(i + 1) for i, op in enumerate(OPS)}
    rows = {r.metric: r for r in dispatch_rows("s", "flat", per_op, calls)}
    assert set(rows) == {f"empty_call_{op}_ns" for op in OPS} | {"dispatch_floor_seq_step_ns"}
    assert all(r.regime == "per-call" and r.status == "ok" for r in rows.values())
    expected = sum(per_op[op] * n for op, n in calls.items()) / calls["append_slot"]
    assert math.isclose(rows["dispatch_floor_seq_step_ns"].value, expected)
    assert np.isclose(rows["empty_call_fork_ns"].value, per_op["fork"])
