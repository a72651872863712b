"""`flat`'s decode loop without the contract's checks: a yardstick. Design: docs/measurement.md#limit_loop.
A module of its own: compiled replay loops are cached per kernels' module."""

from __future__ import annotations

import numpy as np
from numba import njit

from impls.core.compiled import Kernels
from impls.designs import flat
from impls.designs.flat import BLOCK_SHIFT, HEADER, LEN, NEXT, ROW, TOP, load, store

_u = np.uint64


@njit(cache=True, inline="always")
def step_frame(table, ints):
    """A yardstick step's constants: rows and columns (unsigned), the block shift and mask, where the ref counts
    and the free stack start."""
    sh = ints[BLOCK_SHIFT]
    refs, stack = flat._regions(table, ints)
    return _u(table.shape[0]), _u(table.shape[1]), sh, (1 << sh) - 1, refs, stack


@njit(cache=True, _nrt=False)
def decode_step(table, ints, seq_ids, cow_out, slot_out):
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return -1, n
    rows, cols, sh, mask, refs, stack = step_frame(table, ints)
    for i in range(n):
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            return -2, i
        rec = HEADER + ROW * seq
        slot = load(ints, rec + NEXT)
        if (slot & mask) == 0:
            length = ints[_u(rec + LEN)]
            j = _u(length >> sh)
            if j >= cols:
                return -3, i
            if (length & mask) == 0:
                top = ints[TOP] - 1
                if top < 0:
                    return -4, i
                ints[TOP] = top
                block = np.int64(ints[_u(stack + top)])
                ints[_u(refs + block)] = 1
                table[_u(seq), j] = block
            else:
                block = np.int64(table[_u(seq), j])
            slot = (block << sh) | (length & mask)
        ints[_u(rec + LEN)] += 1
        store(ints, rec + NEXT, slot + 1)
        slot_out[_u(i)] = slot
    return 0, 0


class UncheckedFlatManager(flat.FlatBlockManager):
    """``flat`` with :func:`decode_step` as its batched step, checking only what keeps its writes in its arrays: a
    yardstick for traces without copy-on-write, not a design."""

    kernels = Kernels(*flat.KERNELS[:5], decode_step, *flat.KERNELS[6:])
