"""TVM's paged KV cache (``src/runtime/vm/paged_kv_cache.cc`` in the ``apache-tvm`` wheel's ``libtvm_runtime.so``)
behind our contract: a C++ engine's page bookkeeping, the baseline of our C++ tier (``cpp-*``).
Design: docs/output.md#harnessenginestvm_enginepy."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from harness.base.replay import ReplayError
from harness.engines.adapter import EngineAdapter
from harness.engines.catalog import CPP_TIER, Baseline
from harness.engines.eras import Era, era_of
from harness.engines.loader import ImportPlan
from harness.errors import InputError
from impls.core.interpreted import append_as_batch

LIBRARY = Path("tvm") / "lib" / "libtvm_runtime.so"  # in the apache-tvm wheel; registers vm.builtin.*
FUNCTIONS = {"create": "paged_attention_kv_cache_create", "add": "kv_state_add_sequence",
             "remove": "kv_state_remove_sequence", "fork": "kv_state_fork_sequence",
             "begin": "kv_state_begin_forward", "end": "kv_state_end_forward",
             "free_pages": "attention_kv_cache_get_num_available_pages",
             "length": "attention_kv_cache_get_sequence_length", "debug_get_kv": "attention_kv_cache_debug_get_kv"}
FFI_0_1_12, FFI_NEWEST = "apache-tvm-ffi==0.1.12", "apache-tvm-ffi==0.1.15.post2"
ERAS = (Era("0.25.0", "0.25.0.post1", "the first release on the package index: paged_attention_kv_cache_create takes "
            "28 arguments (a config of 5 fields); no attention_kv_cache_get_sequence_length (a length is the bound "
            "debug_get_kv reads to); its runtime links tvm::ffi::json::Stringify taking Optional<int> by value, "
            "which apache-tvm-ffi exports in 0.1.12 alone of the releases its >=0.1.12 allows",
            drive={"companions": (FFI_0_1_12,), "length": False}),
        Era("0.26.0", "0.26.0", "its runtime links json::Stringify taking Optional<int> by reference (apache-tvm-ffi "
            "0.1.13 on; it requires >=0.1.13.post2): run with 0.1.15.post2, as pip resolves it and as 0.27.0's",
            drive={"companions": (FFI_NEWEST,), "length": False}),
        Era("0.27.0", "0.27.0.post1", "registers attention_kv_cache_get_sequence_length (read for a length); the "
            "config may hold a sixth field (a per-layer sliding window, unset here)",
            drive={"companions": (FFI_NEWEST,), "length": True}))
BEFORE = ("the package index lists no apache-tvm release before 0.25.0 (`pip index versions apache-tvm`; older TVM "
          "was published as source archives)")
HEAD_DIM = 8  # one layer, one head of 8 features: the pages' tensor stays small (no attention runs)


def era(version: str | None = None) -> Era:
    return era_of(ERAS, "tvm", version, BEFORE)


def wheels(version: str | None = None) -> tuple[str, tuple[str, ...]]:
    """The release to fetch (None: the newest one read) and the wheels its runtime loads beside it."""
    e = era(version)
    return version or e.last, tuple(e.drive["companions"])


def plan(version: str | None = None) -> ImportPlan:
    """``tvm_ffi`` imported whole from the unpacked wheels (its core is compiled); nothing of ``tvm``'s Python."""
    era(version)
    return ImportPlan(packages=("tvm_ffi",), real=(), compiled=("tvm_ffi",))


def load(version: str | None = None) -> SimpleNamespace:
    """The runtime library loaded through ``tvm_ffi`` and the global functions the adapter calls."""
    import tvm_ffi
    from tvm_ffi import _ffi_api

    library = Path(tvm_ffi.__file__).resolve().parent.parent / LIBRARY
    try:
        ctypes.CDLL(str(library), ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise InputError(f"tvm {version}: {library} does not load ({exc}); delete that folder of the engines' "
                         "cache and run again") from None
    found = {key: tvm_ffi.get_global_func(f"vm.builtin.{name}", allow_missing=True) for key, name in FUNCTIONS.items()}
    e = era(version)
    missing = [FUNCTIONS[key] for key, f in found.items() if f is None and (key != "length" or e.drive["length"])]
    if missing:
        raise InputError(f"tvm {version}: {LIBRARY.name} registers no vm.builtin.{missing[0]}; the adapter "
                         f"(harness/engines/tvm_engine.py) drives the functions of the runtimes of {e.first}..{e.last}")
    if not e.drive["length"]:
        found["length"] = None
    return SimpleNamespace(ffi=tvm_ffi, shape=_ffi_api.Shape, **found)


class PagedKVCache:
    """TVM's cache object and the runtime's functions on it, one method per call (the call meter times these)."""

    def __init__(self, tvm: SimpleNamespace, kv: object) -> None:
        self._kv = kv
        self._add, self._remove, self._fork = tvm.add, tvm.remove, tvm.fork
        self._begin, self._end, self._free, self._length = tvm.begin, tvm.end, tvm.free_pages, tvm.length

    def add_sequence(self, seq_id: int) -> None:
        self._add(self._kv, seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        self._remove(self._kv, seq_id)

    def fork_sequence(self, parent_id: int, child_id: int) -> None:
        self._fork(self._kv, parent_id, child_id, -1)

    def begin_forward(self, seq_ids: object, append_lengths: object) -> None:
        self._begin(self._kv, seq_ids, append_lengths)

    def end_forward(self) -> None:
        self._end(self._kv)

    def num_available_pages(self) -> int:
        return self._free(self._kv)

    def sequence_length(self, seq_id: int) -> int:
        return self._length(self._kv, seq_id)


@dataclass
class Sharing:
    """Rows whose last page the contract still counts as shared after forks that TVM served with copies at once
    (``pairs``: TVM's (source, copy) pages of those copies, one fewer than the rows)."""

    rows: set[int] = field(default_factory=set)
    pairs: list[tuple[int, int]] = field(default_factory=list)


class TvmEngine(EngineAdapter):
    """TVM's ``PagedAttentionKVCache`` (its runtime's, loaded) on ``cpu:0``, no attention kernels: one
    ``begin_forward`` / ``end_forward`` pair per decode step, ``add_sequence`` and a prefill pair per admission,
    ``fork_sequence``, ``remove_sequence``."""

    tvm: SimpleNamespace

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        tvm = self.tvm
        self._copied: list[tuple[int, int]] = []
        self._positions: list[np.ndarray] = []
        kv = tvm.create(*self._arguments())
        self.cache = PagedKVCache(tvm, kv)
        self._kv, self._shape, self._ones = kv, tvm.shape, {}
        # A fork's copy happens at once in TVM, at the row's next append in the contract: pages spare for them.
        self._spare = self.cache.num_available_pages() - self.num_blocks
        self._sharing: dict[int, Sharing] = {}
        self._early = 0  # copies TVM made that the contract has not made yet

    def _arguments(self) -> tuple:
        """``paged_attention_kv_cache_create``'s 28 arguments: one layer, no kernels, stand-in functions."""
        ffi, shape, bs = self.tvm.ffi, self.tvm.ffi.Shape, self.block_size
        copied, read = self._copied, self._positions  # not self: the cache holds these functions
        stub = ffi.convert(lambda *args: None)
        copy = ffi.convert(lambda pages, src, dst, length: copied.append((int(src), int(dst))))
        debug = ffi.convert(lambda pages, positions, k, v, layer: read.append(np.from_dlpack(positions).copy()))
        tokens = (self.num_blocks + self.max_seqs) * bs
        config = shape([self.max_seqs, tokens, self.max_blocks_per_seq * bs, bs, 0])
        pages_like = ffi.from_dlpack(np.zeros(1, np.float16))  # the pages' dtype and device (cpu:0)
        return (config, shape([0, 1]), 1, 1, HEAD_DIM, HEAD_DIM, shape([0]), False, 0, 1.0, 1e4, None, pages_like,
                None, None, [], [], [], [], [], [], [], [], [stub, stub], stub, copy, debug, stub)

    def num_free_blocks(self) -> int:
        return self.cache.num_available_pages() - self._spare + self._early

    def _lengths(self, n: int) -> object:
        ones = self._ones.get(n)
        if ones is None:
            ones = self._ones[n] = self._shape(*[1] * n)
        return ones

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        cache = self.cache
        cache.add_sequence(seq_id)
        if self._admit_tokens:
            cache.begin_forward(self._shape(seq_id), self._shape(self._admit_tokens))
            cache.end_forward()

    def _decode(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One forward's bookkeeping for the batch; the slots' offsets in their pages; the contract's copies."""
        cache = self.cache
        cache.begin_forward(self._shape(*ids), self._lengths(len(ids)))
        cache.end_forward()
        lens, mask, slots = self._lens, self.block_size - 1, []
        for s in ids:
            n = lens[s]
            lens[s] = n + 1
            slots.append(n & mask)
        slot_out[: len(ids)] = slots
        return self._copies(ids, cow_out) if self._early else 0

    _engine_step = _decode
    _append = append_as_batch

    def _copies(self, ids: list[int], cow_out: np.ndarray) -> int:
        """The copies the contract makes at these rows' appends (TVM made them at the fork), reported now."""
        k = 0
        for s in ids:
            group = self._sharing.get(s)
            if group is not None:
                cow_out[k] = group.pairs.pop()
                k += 1
                self._leave(s, group)
        return k

    def _leave(self, seq_id: int, group: Sharing) -> None:
        """The row no longer shares its last page (in the contract's terms); the group ends at one row."""
        group.rows.discard(seq_id)
        del self._sharing[seq_id]
        self._early -= 1
        if len(group.rows) == 1:
            del self._sharing[group.rows.pop()]

    def _fork(self, parent_id: int, child_id: int) -> None:
        self._copied.clear()
        self.cache.fork_sequence(parent_id, child_id)
        if self._copied:  # the parent's partial last page copied for the child
            group = self._sharing.get(parent_id)
            if group is None:
                group = self._sharing[parent_id] = Sharing({parent_id})
            group.rows.add(child_id)
            group.pairs += self._copied
            self._sharing[child_id] = group
            self._early += len(self._copied)

    def _free(self, seq_id: int) -> None:
        self.cache.remove_sequence(seq_id)
        group = self._sharing.get(seq_id)
        if group is not None:  # the contract drops a reference: one copy fewer will happen
            group.pairs.pop()
            self._leave(seq_id, group)

    def _last_shared(self, seq_id: int) -> bool:
        return seq_id in self._sharing

    def _last_slot(self, seq_id: int) -> int:
        return (self._lens[seq_id] - 1) & (self.block_size - 1)

    def seq_len(self, seq_id: int) -> int:
        """The sequence's length as TVM counts it (before 0.27.0, which has no getter: what debug_get_kv reads)."""
        row = self._active(seq_id)
        return int(self.cache.sequence_length(row)) if self.tvm.length is not None else self._readable(row)

    def _readable(self, seq_id: int) -> int:
        """The longest prefix of the sequence TVM's debug_get_kv reads (it refuses an end_pos past the length)."""
        low, high, cap = 0, self._lens[seq_id] + 1, self.max_blocks_per_seq * self.block_size + 1
        while high < cap and self._positions_of(seq_id, high) is not None:
            low, high = high, min(2 * high, cap)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self._positions_of(seq_id, mid) is not None else (low, mid)
        return low

    def _positions_of(self, seq_id: int, length: int) -> np.ndarray | None:
        """TVM's position map of the sequence's first ``length`` tokens (untimed); None where TVM refuses the end."""
        ffi = self.tvm.ffi
        self._positions.clear()
        k, v = (ffi.from_dlpack(np.zeros((1, length, 1, HEAD_DIM), np.float16)) for _ in range(2))
        try:
            self.tvm.debug_get_kv(self._kv, seq_id, 0, length, k, v)
        except Exception as exc:  # the runtime's failed check, as tvm_ffi raises it
            if "end_pos" not in str(exc):
                raise
            return None
        return self._positions.pop()

    def _table(self, seq_id: int) -> list[int]:
        """TVM's pages of the sequence, read through its debug_get_kv (the block trace's position map; untimed)."""
        positions = self._positions_of(seq_id, self._lens[seq_id])
        if positions is None:
            raise ReplayError(f"row {seq_id}: TVM holds fewer than its {self._lens[seq_id]} tokens")
        return [int(p) // self.block_size for p in positions[:: self.block_size]]

    def _ref(self, block_id: int) -> int:
        return sum(self._table(s).count(block_id) for s in range(self.max_seqs) if self._lens[s])


HOW = ("TVM {version}'s PagedAttentionKVCache from the wheel's libtvm_runtime.so (through {ffi}), on "
       "cpu:0 with one layer of one 8-feature head and no attention kernels (empty kernel lists; the "
       "split-rotary, compact-copy and merge functions stand-ins never called; copy-single-page a stand-in "
       "that records the pages TVM copies): per admission add_sequence and a begin_forward/end_forward of the "
       "prompt; per decode step one begin_forward(ids, ones) and end_forward (TVM reserves each row's token, "
       "takes pages from its free-page stack, and builds the attention's host-side page tables, position maps "
       "and lengths); fork_sequence(parent, child, -1) copies a partial last page at once, the contract at the "
       "row's next append (the copy is reported there, its page counted free until then); remove_sequence at a "
       "free; the ids' Shape made by tvm_ffi's Shape constructor function (not its Python class, which checks "
       "every element in Python); slots: the offsets in their pages (TVM hands the page part only to attention "
       "kernels), the pages checked at the end through debug_get_kv, the lengths through {length}")


def baselines(tvm: SimpleNamespace, version: str) -> list[Baseline]:
    """One baseline, TVM's page bookkeeping, calibrating the C++ tier and modelled by none of it."""
    cls = type("TvmEngine", (TvmEngine,), {"tvm": tvm})
    e = era(version)
    length = "get_sequence_length" if e.drive["length"] else "the end debug_get_kv reads to (no getter before 0.27.0)"
    how = HOW.format(version=version, ffi=e.drive["companions"][0], length=length)
    return [Baseline("page bookkeeping", cls, CPP_TIER, (), how, engine_object="cache")]
