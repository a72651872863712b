"""The pool operations of a trace and of a whole step, as calls of the contract: the one switch over op codes."""

from __future__ import annotations

from dataclasses import dataclass

from impls.contract import ALLOCATE, ALLOCATE_CACHED, CAN_ALLOCATE, FORK, FREE, OP_NAMES, SEAL

ARGS = ("a0", "a1", "arg")


@dataclass(frozen=True)
class PoolOp:
    """One op code as a contract call."""

    method: str
    args: tuple[str, ...]
    result: str  # "answer": a yes/no the trace records in a1; "hits": prompt tokens served from the cache; ""
    kind: str  # the pool work it does: "alloc" (takes blocks), "free" (releases them), "other"


POOL_OPS: dict[int, PoolOp] = {
    CAN_ALLOCATE: PoolOp(OP_NAMES[CAN_ALLOCATE], ("a0",), "answer", "other"),
    ALLOCATE: PoolOp(OP_NAMES[ALLOCATE], ("a0", "a1"), "", "alloc"),
    ALLOCATE_CACHED: PoolOp(OP_NAMES[ALLOCATE_CACHED], ("a0", "a1", "arg"), "hits", "alloc"),
    SEAL: PoolOp(OP_NAMES[SEAL], ("a0", "arg"), "answer", "other"),
    FORK: PoolOp(OP_NAMES[FORK], ("a0", "a1"), "", "other"),
    FREE: PoolOp(OP_NAMES[FREE], ("a0",), "", "free"),
}


def call_args(op: int, a0: int, a1: int, arg: object = None) -> tuple:
    """The arguments op ``op`` passes to its method."""
    values = {"a0": a0, "a1": a1, "arg": arg}
    return tuple(values[name] for name in POOL_OPS[op].args)


def apply(mgr: object, op: int, a0: int, a1: int, arg: object = None) -> object:
    """Make the contract call of one pool operation on ``mgr``; returns what the method returned."""
    return getattr(mgr, POOL_OPS[op].method)(*call_args(op, a0, a1, arg))
