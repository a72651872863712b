"""The ctypes binding of the native library and the per-call wrapper classes."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from impls.contract import E_INACTIVE, E_OOM, blocks_for, fork_culprit
from impls.core.base import ManagerBase
from impls.core.ids import ROW_BYTES, id_bytes
from impls.core.validation import batch_args, block_arg, count_arg, lookup_args, seq_arg, tokens_arg
from impls.native import toolchain

KIND_DICT, KIND_LIST, KIND_FLAT, KIND_FLAT_ROWS = 0, 1, 2, 3
_I64, _I32P, _P = ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p

_SIGNATURES = {
    "kvb_abi_version": (_I64, []),
    "kvb_create": (_P, [_I64] * 5),
    "kvb_destroy": (None, [_P]),
    "kvb_can_allocate": (_I64, [_P, _I64]),
    "kvb_allocate": (_I64, [_P, _I64, _I64]),
    "kvb_append": (_I64, [_P, _I64, _P]),
    "kvb_fork": (_I64, [_P, _I64, _I64]),
    "kvb_free": (_I64, [_P, _I64]),
    "kvb_last_slot": (_I64, [_P, _I64]),
    "kvb_decode_step": (_I64, [_P, _P, _I64, _P, _I64, _P, _I64, _P]),
    "kvb_lookup": (_I64, [_P, _P, _I64, _P, _I64, _P]),
    "kvb_decode_step_i32": (_I64, [_P, _I32P, _I64, _P, _I64, _P, _I64, _P]),
    "kvb_lookup_i32": (_I64, [_P, _I32P, _I64, _P, _I64, _P]),
    "kvb_num_free": (_I64, [_P]),
    "kvb_seq_len": (_I64, [_P, _I64]),
    "kvb_block_table": (_I64, [_P, _I64, _P, _I64]),
    "kvb_ref_count": (_I64, [_P, _I64]),
    "kvb_table_nbytes": (_I64, [_P, _I64]),
    "kvb_id_bytes": (_I64, [_P]),
    "kvb_rows_in_use": (_I64, [_P]),
    "kvb_row_count": (_I64, [_I64, _I64, _I64]),
    "kvb_alloc_count": (_I64, []),
    "kvb_alloc_bytes": (_I64, []),
    "kvb_kind_function": (_P, [_P, _I64]),
}
ABI_VERSION = 4


def load_library(path: Path) -> ctypes.CDLL:
    """Open the built designs' library with every function's signature declared (:func:`toolchain.load`)."""
    return toolchain.load(path, _SIGNATURES, "kvb_abi_version", ABI_VERSION)


LIB: list[ctypes.CDLL] = []


def lib() -> ctypes.CDLL:
    if not LIB:
        from impls.native import UNAVAILABLE_REASON

        raise RuntimeError(f"the native designs are unavailable: {UNAVAILABLE_REASON}")
    return LIB[0]


class NativeBlockManager(ManagerBase):
    """A C++ design behind the contract, one foreign call per operation (subclasses set ``kind``)."""

    kind: int
    native = True

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        if self.max_blocks_per_seq * self.block_size > 2**31 - 1 or self.max_seqs > 2**31 - 1:
            raise ValueError("the native designs keep lengths in int32: max_blocks_per_seq * block_size and "
                             "max_seqs must stay below 2**31")
        self._lib = lib()
        self._h = self._lib.kvb_create(self.kind, self.num_blocks, self.block_size, self.max_seqs,
                                       self.max_blocks_per_seq)
        if not self._h:
            raise MemoryError("the native manager could not be created")
        self._pair = np.zeros(2, dtype=np.int64)
        self._detail = np.zeros(1, dtype=np.int64)

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h:
            self._h = None
            self._lib.kvb_destroy(h)

    def _check(self, rc: int, seq: int = -1, **context: object) -> int:
        if rc < 0:
            self._fail(rc, seq, **context)
        return rc

    def _fail(self, code: int, seq: int = -1, **context: object) -> None:
        if code == E_OOM:
            raise MemoryError("std::bad_alloc in the native manager")
        super()._fail(code, seq, **context)

    def can_allocate(self, num_blocks: int) -> bool:
        n = count_arg(num_blocks)
        if n > self.num_blocks:
            return False
        return self._lib.kvb_can_allocate(self._h, n) == 1

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        seq = seq_arg(seq_id, self.max_seqs)
        tokens = tokens_arg(num_tokens, seq, self.max_blocks_per_seq, self.block_shift)
        rc = self._lib.kvb_allocate(self._h, seq, tokens)
        self._check(rc, seq, num_tokens=tokens, need=blocks_for(tokens, self.block_size))

    def append_slot(self, seq_id: int) -> tuple[int, int] | None:
        seq = seq_arg(seq_id, self.max_seqs)
        rc = self._lib.kvb_append(self._h, seq, self._pair.ctypes.data)
        self._check(rc, seq, need=1)
        return (int(self._pair[0]), int(self._pair[1])) if rc else None

    def fork(self, parent_id: int, child_id: int) -> None:
        parent, child = seq_arg(parent_id, self.max_seqs), seq_arg(child_id, self.max_seqs)
        rc = self._lib.kvb_fork(self._h, parent, child)
        if rc:
            self._check(rc, fork_culprit(rc, parent, child, self.max_seqs))

    def free(self, seq_id: int) -> None:
        seq = seq_arg(seq_id, self.max_seqs)
        self._check(self._lib.kvb_free(self._h, seq), seq)

    def last_slot(self, seq_id: int) -> int:
        seq = seq_arg(seq_id, self.max_seqs)
        return self._check(self._lib.kvb_last_slot(self._h, seq), seq)

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        ids = batch_args(seq_ids, cow_out, slot_out, self.max_seqs)
        cow, slot = cow_out, slot_out
        rc = self._lib.kvb_decode_step(self._h, ids.ctypes.data, len(ids), cow.ctypes.data, cow.shape[0],
                                       slot.ctypes.data, slot.shape[0], self._detail.ctypes.data)
        if rc < 0:
            self._fail_batch(rc, int(self._detail[0]), ids, min(cow.shape[0], slot.shape[0]))
        return rc

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        ids, slot = lookup_args(seq_ids, slot_out, self.max_seqs), slot_out
        rc = self._lib.kvb_lookup(self._h, ids.ctypes.data, len(ids), slot.ctypes.data, slot.shape[0],
                                  self._detail.ctypes.data)
        if rc < 0:
            self._fail_batch(rc, int(self._detail[0]), ids, slot.shape[0])

    def num_free_blocks(self) -> int:
        return self._lib.kvb_num_free(self._h)

    def seq_len(self, seq_id: int) -> int:
        seq = seq_arg(seq_id, self.max_seqs)
        n = self._lib.kvb_seq_len(self._h, seq)
        self._check(E_INACTIVE if n == 0 else n, seq)
        return n

    def block_table(self, seq_id: int) -> list[int]:
        seq = seq_arg(seq_id, self.max_seqs)
        out = np.zeros(blocks_for(self.seq_len(seq), self.block_size), dtype=np.int64)
        n = self._check(self._lib.kvb_block_table(self._h, seq, out.ctypes.data, len(out)), seq)
        return out[:n].tolist()

    def ref_count(self, block_id: int) -> int:
        block = block_arg(block_id, self.num_blocks)
        return self._check(self._lib.kvb_ref_count(self._h, block), block=block)

    def table_nbytes(self, seq_id: int) -> int | None:
        """Bytes of table state for the sequence, as each C++ design holds it (before malloc's rounding)."""
        seq = seq_arg(seq_id, self.max_seqs)
        return self._check(self._lib.kvb_table_nbytes(self._h, seq), seq)

    def id_bytes(self) -> int:
        """Bytes per block id in the table (2 for ``cpp-flat`` and ``cpp-flat-rows`` up to 65,536 blocks, else 4)."""
        return self._lib.kvb_id_bytes(self._h)


class CppDictBlockManager(NativeBlockManager):
    """Design A in C++ (``"cpp-dict"``): ``std::unordered_map`` per sequence."""

    kind = KIND_DICT

    def memory_bytes(self) -> int:
        return 4 * self.num_blocks + 8 * self.max_seqs


class CppListBlockManager(NativeBlockManager):
    """Design B in C++ (``"cpp-list"``): ``std::vector`` per sequence, grown by ``push_back``."""

    kind = KIND_LIST

    def memory_bytes(self) -> int:
        return 8 * self.num_blocks + 32 * self.max_seqs


class CppFlatBlockManager(NativeBlockManager):
    """Design C in C++ (``"cpp-flat"``): flat uint16 (uint32 above 65,536 blocks) table + free-block stack."""

    kind = KIND_FLAT

    def memory_bytes(self) -> int:
        ids = id_bytes(self.num_blocks)
        return 8 * self.num_blocks + self.max_seqs * (ids * self.max_blocks_per_seq + 40)


class CppFlatRowsBlockManager(NativeBlockManager):
    """``flat-rows`` in C++ (``"cpp-flat-rows"``): the same block ids, tables and ref counts for the same calls."""

    kind = KIND_FLAT_ROWS

    def _layout(self) -> tuple[int, int, int]:
        """(ids per row, directory entries per sequence, rows in the pool), as the constructor sizes them."""
        ids = ROW_BYTES // id_bytes(self.num_blocks)
        num_rows = lib().kvb_row_count(self.num_blocks, self.max_seqs, self.max_blocks_per_seq)
        return ids, -(-self.max_blocks_per_seq // ids), num_rows

    def memory_bytes(self) -> int:
        _, dir_len, num_rows = self._layout()
        return (ROW_BYTES + 8) * num_rows + 8 * self.num_blocks + self.max_seqs * (4 * dir_len + 8)

    @property
    def num_rows(self) -> int:
        return self._layout()[2]

    def rows_in_use(self) -> int:
        """Rows of the pool held by some directory (the rest are free), as ``flat-rows``' ``rows_in_use``."""
        return self._lib.kvb_rows_in_use(self._h)


def alloc_count() -> int:
    """Allocation calls made by every native container so far (a process-wide counter)."""
    return int(lib().kvb_alloc_count())


def alloc_bytes() -> int:
    """Bytes asked for by those allocation calls so far (a process-wide counter)."""
    return int(lib().kvb_alloc_bytes())


def function_address(name: str) -> int:
    """The address of the library's C function ``name`` (for a caller in C++ that calls it directly)."""
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value


KIND_FUNCTIONS = ("can_allocate", "allocate", "fork", "free", "decode_step_i32", "lookup_i32")


def kind_function_addresses(mgr: NativeBlockManager) -> tuple[int, ...]:
    """The addresses of :data:`KIND_FUNCTIONS` made for ``mgr``'s kind of manager (the ``kvb_*`` functions'
    signatures, without their dispatch on the kind), for a caller in C++."""
    return tuple(lib().kvb_kind_function(mgr._h, which) for which in range(len(KIND_FUNCTIONS)))
