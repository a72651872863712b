"""Contract plumbing shared by the compiled (Numba) designs."""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np
from numba import njit, typeof

from impls.contract import (
    ALLOCATE,
    CAN_ALLOCATE,
    E_COUNT,
    E_NO_BLOCKS,
    E_SEQ_RANGE,
    E_TOKENS,
    E_TOO_LONG,
    FREE,
    STEP_EXTRA,
    blocks_for,
    fork_culprit,
)
from impls.core.base import ManagerBase
from impls.core.jit import specialise, spread_state
from impls.core.validation import (
    INT64,  # native int64: byte order is the one buffer property Numba's types lack
    batch_args,
    check_active,
    count_arg,
    lookup_args,
    refuse_op,
    seq_arg,
    step_args,
    tokens_arg,
)


class Kernels(NamedTuple):
    """A compiled design's operations; each takes ``*state`` first and returns a status code."""

    can_allocate: Callable  # (n) -> 1 | 0 | <0
    allocate: Callable  # (seq, num_tokens) -> 0 | <0
    append: Callable  # (seq) -> (1 if copy-on-write else 0 | <0, src, dst)
    fork: Callable  # (parent, child) -> 0 | <0
    free: Callable  # (seq) -> 0 | <0
    decode_step: Callable  # (seq_ids, cow_out, slot_out) -> (number of CoWs | <0, detail)
    lookup: Callable  # (seq_ids, slot_out) -> (0 | <0, detail)
    last_slot: Callable  # (seq) -> slot | <0


_k_can = _k_alloc = _k_fork = _k_free = _k_step = None


RECHECK = -2


@njit(inline="always")
def _meet(a, b):
    """Whether two C-contiguous arrays share memory (what np.may_share_memory says of such arrays)."""
    pa, pb = a.ctypes.data, b.ctypes.data
    return a.size > 0 and b.size > 0 and pa < pb + b.nbytes and pb < pa + a.nbytes


@njit(inline="always")
def _unfit(ops, a0, a1, seq_ids, status_out, cow_out, slot_out):
    """Whether the step's buffers break a rule that their Numba types do not already carry."""
    m, n = ops.shape[0], seq_ids.shape[0]
    if a0.shape[0] != m or a1.shape[0] != m or status_out.shape[0] < m + STEP_EXTRA:
        return True
    if cow_out.shape[1] != 2 or cow_out.shape[0] < n or slot_out.shape[0] < n:
        return True
    if (status_out.ctypes.data | cow_out.ctypes.data | slot_out.ctypes.data) & 7:
        return True
    if _meet(status_out, cow_out) or _meet(status_out, slot_out) or _meet(cow_out, slot_out):
        return True
    return (_meets_input(status_out, ops, a0, a1, seq_ids) or _meets_input(cow_out, ops, a0, a1, seq_ids)
            or _meets_input(slot_out, ops, a0, a1, seq_ids))


@njit(inline="always")
def _meets_input(out, ops, a0, a1, seq_ids):
    return _meet(out, ops) or _meet(out, a0) or _meet(out, a1) or _meet(out, seq_ids)


# One function on purpose: each helper taking arrays would add reference counting per call.
def _step_loop(state, ops, a0, a1, seq_ids, status_out, cow_out, slot_out, rows, max_tokens, num_blocks):  # noqa: C901
    """The whole-step kernel: ``(cows or code, -1)``, ``(code, i)`` for a bad op code, or ``(0, RECHECK)``."""
    if _unfit(ops, a0, a1, seq_ids, status_out, cow_out, slot_out):
        return 0, RECHECK
    m = ops.shape[0]
    for i in range(m):
        if ops[i] < CAN_ALLOCATE or ops[i] > FREE:
            return ops[i], i
    for i in range(m):
        o, x, y = ops[i], a0[i], a1[i]
        if o == CAN_ALLOCATE:
            rc = E_COUNT if x < 0 else (0 if x > num_blocks else _k_can(state, x))
        elif o == FREE:
            rc = E_SEQ_RANGE if x < 0 or x >= rows else _k_free(state, x)
        elif o == ALLOCATE:
            if x < 0 or x >= rows:
                rc = E_SEQ_RANGE
            elif y < 1:
                rc = E_TOKENS
            elif y > max_tokens:
                rc = E_TOO_LONG
            else:
                rc = _k_alloc(state, x, y)
        else:
            rc = E_SEQ_RANGE if x < 0 or x >= rows or y < 0 or y >= rows else _k_fork(state, x, y)
        status_out[i] = rc
    rc, detail = _k_step(state, seq_ids, cow_out, slot_out)
    if rc >= 0:
        status_out[m] = 0
        status_out[m + 1] = 0
        return rc, -1
    if rc != E_NO_BLOCKS and 0 <= detail < seq_ids.shape[0]:
        detail = seq_ids[detail]
    status_out[m] = rc
    status_out[m + 1] = detail
    return rc, -1


_STEP_KERNELS: dict[str, Callable] = {}
_EXACT_STEP_KERNELS: dict[tuple, Callable] = {}


_ENTRY_POINTS: dict[tuple, Callable] = {}
_INT_TYPE = typeof(0)
_ARRAY_TYPES: dict[tuple, object] = {}


def _type_of(x: object) -> object:
    """``numba.typeof(x)``, cached for arrays by what their Numba type depends on."""
    if type(x) is not np.ndarray:
        return typeof(x)
    f = x.flags
    key = (x.dtype, x.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned)
    if key not in _ARRAY_TYPES:
        _ARRAY_TYPES[key] = typeof(x)
    return _ARRAY_TYPES[key]


def _entry_point(kernel: Callable, sig: tuple) -> Callable:
    """The compiled entry point of ``kernel`` for ``sig``, found once per kernel and signature."""
    key = (kernel, sig)
    if key not in _ENTRY_POINTS:
        _ENTRY_POINTS[key] = kernel.compile(sig)
    return _ENTRY_POINTS[key]


def _entry(op: str, ints: int) -> functools.cached_property:
    """The entry point of kernel ``op`` bound to the manager's state, computed once per state."""
    def bind(self: CompiledBlockManager) -> Callable:
        sig = (*self._ep_state_types, *([_INT_TYPE] * ints))
        return partial(_entry_point(getattr(self.kernels, op), sig), *self._state)

    bind.__name__ = "_ep_" + op
    return functools.cached_property(bind)


def step_kernel(kernels: Kernels) -> Callable:
    """The compiled whole-step loop over ``kernels``, one per design (cached by Numba across processes)."""
    key = kernels.decode_step.py_func.__module__
    if key not in _STEP_KERNELS:
        _STEP_KERNELS[key] = njit(cache=True)(_step_function(kernels, key))
    return _STEP_KERNELS[key]


def exact_step_kernel(kernels: Kernels, state: tuple) -> Callable:
    """The whole-step loop compiled for exactly one signature; other buffers are a ``TypeError``."""
    key = (kernels.decode_step.py_func.__module__, typeof(state))
    if key not in _EXACT_STEP_KERNELS:
        vec, pairs, num = typeof(np.zeros(1, np.int64)), typeof(np.zeros((1, 2), np.int64)), typeof(0)
        kernel = njit(cache=True)(_step_function(kernels, key[0]))
        kernel.compile((key[1], vec, vec, vec, vec, vec, pairs, vec, num, num, num))
        kernel.disable_compile()
        _EXACT_STEP_KERNELS[key] = kernel
    return _EXACT_STEP_KERNELS[key]


def _step_function(kernels: Kernels, module: str) -> types.FunctionType:
    """:func:`_step_loop` as a function of its own for one design, reading that design's kernels as globals."""
    return specialise(_step_loop, module, _k_can=spread_state(kernels.can_allocate, 1),
                      _k_alloc=spread_state(kernels.allocate, 2), _k_fork=spread_state(kernels.fork, 2),
                      _k_free=spread_state(kernels.free, 1), _k_step=spread_state(kernels.decode_step, 3))


def _empty(arity: int, result: str) -> Callable:
    names = ", ".join(f"a{i}" for i in range(arity))
    env: dict = {}
    exec(f"def empty({names}):\n    return {result}\n", env)
    return njit(env["empty"])


@functools.cache
def empty_kernels(state_len: int) -> Kernels:
    """Kernels taking ``state_len`` state arguments, as a design's, that do nothing and return success."""
    one, two = _empty(state_len + 1, "0"), _empty(state_len + 2, "0")
    return Kernels(one, two, _empty(state_len + 1, "(0, -1, -1)"), two, one, _empty(state_len + 3, "(0, 0)"),
                   _empty(state_len + 2, "(0, 0)"), one)


def empty_step_kernel(state: tuple) -> Callable:
    """A compiled no-op with the step kernel's signature: one crossing into compiled code with a step's arguments."""
    key = ("empty", typeof(state))
    if key not in _EXACT_STEP_KERNELS:
        vec, pairs, num = typeof(np.zeros(1, np.int64)), typeof(np.zeros((1, 2), np.int64)), typeof(0)
        kernel = _empty(len(state) + 10, "(0, -1)")
        kernel.compile((*key[1], vec, vec, vec, vec, vec, pairs, vec, num, num, num))
        kernel.disable_compile()
        _EXACT_STEP_KERNELS[key] = kernel
    return _EXACT_STEP_KERNELS[key]


def with_empty_kernels(mgr: CompiledBlockManager) -> CompiledBlockManager:
    """A copy of ``mgr`` (sharing its state) whose every kernel is empty, entered through the same path."""
    empty = copy.copy(mgr)
    empty.kernels = empty_kernels(len(mgr.state))
    empty.rebind()
    return empty

class CachingKernels(NamedTuple):
    """``Kernels`` plus the prefix-caching operations, for designs whose kernels provide them."""

    can_allocate: Callable
    allocate: Callable
    append: Callable
    fork: Callable
    free: Callable
    decode_step: Callable
    lookup: Callable
    last_slot: Callable
    allocate_cached: Callable  # (seq, num_tokens, chain uint64[:]) -> tokens served from the cache | <0
    seal: Callable  # (seq, block_hash as a 64-bit integer) -> 1 | 0 | <0

class CompiledBlockManager(ManagerBase):
    """Base class of compiled designs. Subclasses set ``kernels``, ``self.state`` and ``self._lens``."""

    kernels: Kernels
    _lens: np.ndarray

    _ep_can_allocate = _entry("can_allocate", 1)
    _ep_allocate = _entry("allocate", 2)
    _ep_append = _entry("append", 1)
    _ep_fork = _entry("fork", 2)
    _ep_free = _entry("free", 1)
    _ep_last_slot = _entry("last_slot", 1)

    @functools.cached_property
    def _ep_state_types(self) -> tuple:
        return tuple(_type_of(x) for x in self._state)

    @functools.cached_property
    def _ep_step_exact(self) -> Callable:
        return partial(exact_step_kernel(self.kernels, self._state), self._state)

    @functools.cached_property
    def _ep_step_dispatch(self) -> Callable:
        return partial(step_kernel(self.kernels), self._state)

    @property
    def state(self) -> tuple:
        """The design's arrays and containers, the first arguments of every kernel."""
        return self._state

    @state.setter
    def state(self, value: tuple) -> None:
        self._state = value
        self.rebind()

    def rebind(self) -> None:
        """Forget the bound entry points: they are bound again, to the current state and kernels, on next use."""
        for name in [n for n in self.__dict__ if n.startswith("_ep_")]:
            del self.__dict__[name]

    def can_allocate(self, num_blocks: int) -> bool:
        if type(num_blocks) is not int or not 0 <= num_blocks <= self.num_blocks:
            if count_arg(num_blocks) > self.num_blocks:
                return False
            num_blocks = int(num_blocks)
        return self._ep_can_allocate(num_blocks) == 1

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        if type(num_tokens) is not int or not 0 < num_tokens <= self.max_tokens:
            num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        rc = self._ep_allocate(seq_id, num_tokens)
        if rc:
            self._fail(rc, seq_id, num_tokens=num_tokens, need=blocks_for(num_tokens, self.block_size))

    def append_slot(self, seq_id: int) -> tuple[int, int] | None:
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc, src, dst = self._ep_append(seq_id)
        if rc < 0:
            self._fail(rc, seq_id, need=1)
        return (src, dst) if rc else None

    def fork(self, parent_id: int, child_id: int) -> None:
        parent_id, child_id = seq_arg(parent_id, self.max_seqs), seq_arg(child_id, self.max_seqs)
        rc = self._ep_fork(parent_id, child_id)
        if rc:
            self._fail(rc, fork_culprit(rc, parent_id, child_id, self.max_seqs))

    def free(self, seq_id: int) -> None:
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc = self._ep_free(seq_id)
        if rc:
            self._fail(rc, seq_id)

    def last_slot(self, seq_id: int) -> int:
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        slot = self._ep_last_slot(seq_id)
        if slot < 0:
            self._fail(slot, seq_id)
        return slot

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One decode step in one compiled call; same semantics as the interpreted designs' step."""
        seq_ids = batch_args(seq_ids, cow_out, slot_out, self.max_seqs)
        rc, detail = self.kernels.decode_step(*self.state, seq_ids, cow_out, slot_out)
        if rc < 0:
            self._fail_batch(rc, detail, seq_ids, min(len(cow_out), len(slot_out)))
        return rc

    def step(self, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray, seq_ids: np.ndarray, status_out: np.ndarray,
             cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One engine step in one compiled call, its buffers checked before anything changes."""
        rc, bad = 0, RECHECK
        try:
            if (ops.dtype is INT64 and a0.dtype is INT64 and a1.dtype is INT64 and seq_ids.dtype is INT64
                    and status_out.dtype is INT64 and cow_out.dtype is INT64 and slot_out.dtype is INT64):
                rc, bad = self._ep_step_exact(ops, a0, a1, seq_ids, status_out, cow_out, slot_out, self.max_seqs,
                                              self.max_tokens, self.num_blocks)
        except (AttributeError, TypeError):
            pass
        if bad == RECHECK:
            ops, a0, a1, ids = step_args(ops, a0, a1, seq_ids, status_out, cow_out, slot_out, self.max_seqs)
            rc, bad = self._ep_step_dispatch(ops, a0, a1, ids, status_out, cow_out, slot_out, self.max_seqs,
                                             self.max_tokens, self.num_blocks)
            if bad == RECHECK:  # pragma: no cover - step_args refuses every buffer the kernel sends back
                raise AssertionError("step_args accepted buffers the step kernel refuses")
        if bad >= 0:
            refuse_op(bad, rc)
        return rc

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        seq_ids = lookup_args(seq_ids, slot_out, self.max_seqs)
        rc, detail = self.kernels.lookup(*self.state, seq_ids, slot_out)
        if rc < 0:
            self._fail_batch(rc, detail, seq_ids, len(slot_out))

    def _active(self, seq_id: object) -> int:
        seq_id = seq_arg(seq_id, self.max_seqs)
        rc = check_active(self._lens, seq_id)
        if rc:
            self._fail(rc, seq_id)
        return seq_id
