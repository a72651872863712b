"""A stand-in for TVM's runtime in the calibration tests: a tiny ``tvm_ffi`` package whose global functions are a
paged KV cache written for the tests (not taken from TVM): a stack of free pages, a page list and a length per
sequence, ref-counted pages, a fork that copies a partial last page at once through the copy function it was given,
a debug read that hands the sequence's position map to the debug function it was given. Every call is logged.

In-process tests take :func:`namespace` (what ``tvm_engine.load`` returns); :func:`write_wheels` packs the package and a
loadable ``tvm/lib/libtvm_runtime.so`` into the two wheels ``calibrate tvm`` fetches (``--find-links``), so a whole
run imports the stand-in exactly as it imports the real runtime.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np

CALLS: list[tuple] = []  # (function, arguments) of every call, in order
CREATE_ARGUMENTS = 28


class Shape(tuple):
    """Stand-in of ``tvm_ffi.Shape``: a tuple of ints."""


def shape(*values: int) -> Shape:
    return Shape(int(v) for v in values)


class Cache:
    """Pages of ``page`` tokens; ``tables[seq]``: its pages, ``lens[seq]``: its tokens; ``refs[page]``."""

    def __init__(self, *args) -> None:
        assert len(args) == CREATE_ARGUMENTS, f"{len(args)} arguments, the constructor takes {CREATE_ARGUMENTS}"
        _, tokens, chunk, self.page, _ = args[0]
        self.chunk, self.copy, self.debug = chunk, args[25], args[26]
        self.free = list(range(tokens // self.page + 1))[::-1]
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.in_forward = False

    def take(self) -> int:
        if not self.free:
            raise RuntimeError("The KV cache is full. No page can be allocated.")
        page = self.free.pop()
        self.refs[page] = 1
        return page

    def drop(self, page: int) -> None:
        self.refs[page] -= 1
        if not self.refs[page]:
            self.free.append(page)


def create(*args) -> Cache:
    CALLS.append(("create", len(args)))
    return Cache(*args)


def add(kv: Cache, seq: int) -> None:
    CALLS.append(("add", seq))
    if seq in kv.tables:
        raise RuntimeError(f"sequence {seq} exists")
    kv.tables[seq], kv.lens[seq] = [], 0


def remove(kv: Cache, seq: int) -> None:
    CALLS.append(("remove", seq))
    for page in kv.tables.pop(seq):
        kv.drop(page)
    del kv.lens[seq]


def fork(kv: Cache, parent: int, child: int, position: int) -> None:
    CALLS.append(("fork", parent, child, position))
    assert position == -1 and child not in kv.tables
    table, length = list(kv.tables[parent]), kv.lens[parent]
    for page in table:
        kv.refs[page] += 1
    if length % kv.page:
        new = kv.take()
        kv.drop(table[-1])
        kv.copy(None, table[-1], new, length % kv.page)
        table[-1] = new
    kv.tables[child], kv.lens[child] = table, length


def begin(kv: Cache, seqs: tuple, lengths: tuple) -> None:
    CALLS.append(("begin", tuple(seqs), tuple(lengths)))
    assert isinstance(seqs, Shape) and isinstance(lengths, Shape) and not kv.in_forward
    if sum(lengths) > kv.chunk:
        raise RuntimeError("the forward's tokens exceed the prefill chunk")
    for seq, n in zip(seqs, lengths, strict=True):
        table = kv.tables[seq]
        if kv.lens[seq] % kv.page and kv.refs[table[-1]] > 1:
            raise RuntimeError(f"sequence {seq}'s last page is shared")
        while len(table) * kv.page < kv.lens[seq] + n:
            table.append(kv.take())
        kv.lens[seq] += n
    kv.in_forward = True


def end(kv: Cache) -> None:
    CALLS.append(("end",))
    kv.in_forward = False


def free_pages(kv: Cache) -> int:
    return len(kv.free)


def length(kv: Cache, seq: int) -> int:
    return kv.lens[seq]


def debug_get_kv(kv: Cache, seq: int, start: int, stop: int, k, v) -> None:
    if not 0 <= start < stop <= kv.lens[seq]:
        raise ValueError("DebugGetKV does not accept out-of-range end_pos")
    table = kv.tables[seq]
    positions = np.array([table[i // kv.page] * kv.page + i % kv.page for i in range(start, stop)], np.int32)
    kv.debug(None, positions, k, v, 0)


FUNCTIONS = {"paged_attention_kv_cache_create": create, "kv_state_add_sequence": add,
             "kv_state_remove_sequence": remove, "kv_state_fork_sequence": fork, "kv_state_begin_forward": begin,
             "kv_state_end_forward": end, "attention_kv_cache_get_num_available_pages": free_pages,
             "attention_kv_cache_get_sequence_length": length, "attention_kv_cache_debug_get_kv": debug_get_kv}
FFI = SimpleNamespace(Shape=lambda values: shape(*values), convert=lambda f: f, from_dlpack=lambda a: a)


def namespace(length: bool = True) -> SimpleNamespace:
    """What ``harness.engines.tvm_engine.load`` returns, on the stand-in's functions (``length``: the runtime has a
    length getter, as from 0.27.0)."""
    from harness.engines.tvm_engine import FUNCTIONS as NAMES

    found = {key: FUNCTIONS[name] for key, name in NAMES.items()}
    return SimpleNamespace(ffi=FFI, shape=shape, **found | ({} if length else {"length": None}))


INIT = '''from tvm_ffi import _ffi_api
from tvm_ffi._runtime import FFI, FUNCTIONS

MISSING = {missing!r}
Shape, convert, from_dlpack = FFI.Shape, FFI.convert, FFI.from_dlpack


def get_global_func(name, allow_missing=False):
    found = FUNCTIONS.get(name.removeprefix("vm.builtin.")) if name.removeprefix("vm.builtin.") != MISSING else None
    if found is None and not allow_missing:
        raise ValueError(name)
    return found
'''


def write_package(root: Path, missing: str = "") -> Path:
    """The stand-in ``tvm_ffi`` package under ``root``; ``missing``: a function its runtime does not register."""
    package = root / "tvm_ffi"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(__file__, package / "_runtime.py")
    (package / "_ffi_api.py").write_text("from tvm_ffi._runtime import shape as Shape  # noqa: F401\n")
    (package / "__init__.py").write_text(INIT.format(missing=missing))
    return root


def write_wheels(folder: Path, missing: str = "", library: bytes | None = None, version: str = "0.27.0.post1",
                 ffi: str = "0.1.15.post2") -> Path:
    """The two wheels ``calibrate tvm==VERSION`` fetches, in ``folder`` (for ``--find-links``): the runtime library
    (a loadable shared library, or ``library``'s bytes) and the stand-in ``tvm_ffi`` (version ``ffi``)."""
    import _ctypes

    from tests.calibration_standin import build_wheel

    runtime = folder / f"tvm-src-{version}" / "tvm" / "lib" / "libtvm_runtime.so"
    runtime.parent.mkdir(parents=True, exist_ok=True)
    if library is None:
        shutil.copyfile(_ctypes.__file__, runtime)
    else:
        runtime.write_bytes(library)
    build_wheel(runtime.parents[2], "apache-tvm", version, folder, "*.so")
    build_wheel(write_package(folder / f"ffi-src-{ffi}", missing), "apache-tvm-ffi", ffi, folder)
    return folder
