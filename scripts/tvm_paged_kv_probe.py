"""Probe (issue 53 item 5): does the ``apache-tvm`` wheel's relax-VM paged KV cache (``paged_kv_cache.cc``) run on
``tvm.cpu()`` with its page bookkeeping alone? Fetches the wheels into the engines' cache (outside the repository,
``pip download --no-deps``), loads ``libtvm_runtime.so`` through ``tvm_ffi`` (no ``import tvm``, no compiler
library), makes a cache with no attention kernels (stand-in functions where the constructor requires one), and
checks its page accounting through sequence add, per-step begin/end forward, fork and remove. Nothing of TVM is
copied into the project. Usage: .venv/bin/python scripts/tvm_paged_kv_probe.py [--time STEPS]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.engines.fetch import default_cache, pip_download

TVM, TVM_FFI = "apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.15.post2"
PAGE, PAGES = 16, 4096  # tokens per page; pages of the pool (the constructor adds one)


def unpacked(requirement: str, members: tuple[str, ...], cache: Path) -> Path:
    """The wheel's files under ``members`` (path prefixes), unpacked once into ``cache/<wheel stem>/``."""
    wheel = pip_download(requirement, cache / "downloads")
    root = cache / wheel.name.removesuffix(".whl")
    if not (root / ".complete").is_file():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root, [n for n in zf.namelist() if n.startswith(members)])
        (root / ".complete").write_text(wheel.name + "\n")
    return root


def functions(cache: Path) -> dict:
    ffi_root = unpacked(TVM_FFI, ("tvm_ffi/",), cache)
    tvm_root = unpacked(TVM, ("tvm/lib/libtvm_runtime.so",), cache)
    sys.path.insert(0, str(ffi_root))
    import tvm_ffi

    ctypes.CDLL(str(tvm_root / "tvm" / "lib" / "libtvm_runtime.so"), ctypes.RTLD_GLOBAL)  # registers vm.builtin.*
    names = {"create": "paged_attention_kv_cache_create", "add": "kv_state_add_sequence",
             "remove": "kv_state_remove_sequence", "fork": "kv_state_fork_sequence", "begin": "kv_state_begin_forward",
             "end": "kv_state_end_forward", "free_pages": "attention_kv_cache_get_num_available_pages",
             "length": "attention_kv_cache_get_sequence_length"}
    return {k: tvm_ffi.get_global_func(f"vm.builtin.{v}") for k, v in names.items()} | {"ffi": tvm_ffi}


def make_cache(f: dict, pages: int = PAGES):
    """A one-layer cache on the CPU: page bookkeeping and host-side aux arrays, no attention kernel (empty lists)."""
    import numpy as np

    ffi = f["ffi"]
    shape, stub = ffi.Shape, ffi.convert(lambda *args: None)
    init = ffi.from_dlpack(np.zeros(1, np.float16))  # the dtype and device (cpu:0) of the pages
    config = shape([256, PAGE * pages, 2048, PAGE, 0])  # sequences, tokens, prefill chunk, page size, no sliding window
    return f["create"](config, shape([0, 1]), 1, 1, 8, 8, shape([0]), False, 0, 1.0, 1e4, None, init, None, None,
                       [], [], [], [], [], [], [], [], [stub, stub], stub, stub, stub, stub)


def check_pages(f: dict) -> None:
    shape, kv = f["ffi"].Shape, make_cache(f)
    total = f["free_pages"](kv)
    assert total == PAGES + 1, total
    f["add"](kv, 0)
    f["begin"](kv, shape([0]), shape([100]))
    f["end"](kv)
    assert (f["length"](kv, 0), total - f["free_pages"](kv)) == (100, 7)  # ceil(100 / 16) pages
    f["fork"](kv, 0, 1, -1)  # the six full pages shared; the partial seventh copied for the child (f_copy_single_page)
    assert total - f["free_pages"](kv) == 8
    f["begin"](kv, shape([0, 1]), shape([1, 1]))
    f["end"](kv)
    assert (f["length"](kv, 0), f["length"](kv, 1), total - f["free_pages"](kv)) == (101, 101, 8)
    f["begin"](kv, shape([0, 1]), shape([12, 12]))  # 113 tokens: an eighth page each
    f["end"](kv)
    assert total - f["free_pages"](kv) == 10
    f["fork"](kv, 0, 2, 96)  # at a page boundary: nothing copied
    assert (f["length"](kv, 2), total - f["free_pages"](kv)) == (96, 10)
    for seq in (2, 1, 0):
        f["remove"](kv, seq)
    assert f["free_pages"](kv) == total
    print(f"page accounting as expected: {total} pages of {PAGE} tokens; 100 tokens take 7; a fork shares the full "
          "pages and copies the partial last one (one page), at a page boundary copies none; 113 tokens take 8; "
          "every page back after remove")


def time_steps(f: dict, steps: int, batch: int = 64) -> None:
    shape, kv = f["ffi"].Shape, make_cache(f, batch * (-(-(40 + steps) // PAGE)))
    seqs, one = shape(list(range(batch))), shape([1] * batch)
    for i in range(batch):
        f["add"](kv, i)
    f["begin"](kv, seqs, shape([40] * batch))
    f["end"](kv)
    start = time.perf_counter_ns()
    for _ in range(steps):
        f["begin"](kv, seqs, one)
        f["end"](kv)
    per = (time.perf_counter_ns() - start) / steps / batch
    print(f"one run, no repetition, not paired with anything: {steps} decode steps of {batch} sequences, "
          f"{per:,.0f} ns per sequence-step (begin_forward and end_forward through tvm_ffi)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--time", type=int, default=0, metavar="STEPS", help="also time STEPS decode steps (one run)")
    args = p.parse_args()
    f = functions(default_cache())
    check_pages(f)
    if args.time:
        time_steps(f, args.time)
    return 0


if __name__ == "__main__":
    sys.exit(main())
