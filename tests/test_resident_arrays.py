"""The compiled designs write every page of their arrays in the constructor: no later operation, a timed step
included, takes a page fault to map one (docs/method.md, "Where a design's arrays live").

Counted, not timed: minor page faults (``getrusage``) over a run of operations on a fresh manager, in a process
whose allocator maps every large array afresh (``MALLOC_MMAP_THRESHOLD_``) and which compiles nothing (a first
process fills Numba's cache: a compilation leaves the heap so large that arrays come from pages already mapped).
The same run on the arrays ``np.zeros`` gives must fault, or the count could not tell the two apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from impls.core.pages import resident_zeros

DESIGNS = {"flat": "impls.designs.flat", "flat-pc": "impls.caching.flat_pc", "flat-rows": "impls.designs.flat_rows"}

SCRIPT = r"""
import json, resource, sys
import numpy as np
from impls import REGISTRY

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def operations(mgr, ids, cows, slots):
    for seq in range(256):
        mgr.allocate(seq, 1000)
    for _ in range(40):
        mgr.decode_step(ids, cows, slots)
    for seq in range(0, 256, 2):
        mgr.free(seq)

def counts(name):
    ids, cows, slots = np.arange(256, dtype=np.int64), np.zeros((256, 2), np.int64), np.zeros(256, np.int64)
    got = []
    for _ in range(3):  # the first also warms the interpreter, the kernels and the allocator's own lists
        mgr = REGISTRY[name](num_blocks=65536, block_size=16, max_seqs=256, max_blocks_per_seq=256)
        before = faults()
        operations(mgr, ids, cows, slots)
        got.append(faults() - before)
        del mgr
    return got[1:]

out = {}
for name, module in json.loads(sys.argv[1]).items():
    out[name] = {"resident": counts(name)}
    resident = sys.modules[module].resident_zeros
    sys.modules[module].resident_zeros = lambda shape, dtype: np.zeros(shape, dtype=dtype)  # pages mapped on use
    out[name]["lazy"] = counts(name)
    sys.modules[module].resident_zeros = resident
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fault_counts() -> dict[str, dict[str, list[int]]]:
    """Per design, the faults of each measured run with its arrays as built ("resident") and as np.zeros
    leaves them ("lazy")."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    command = [sys.executable, "-c", SCRIPT, json.dumps(DESIGNS)]
    subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=True)  # compiles
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_resident_zeros_are_zeros_of_the_shape_and_dtype():
    got = resident_zeros((3, 5), "uint16")
    assert got.shape == (3, 5) and got.dtype == "uint16" and not got.any() and got.flags.writeable


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_no_operation_maps_a_page_of_the_design(name, fault_counts):
    got = fault_counts[name]
    if min(got["lazy"]) == 0:
        pytest.skip(f"this system maps calloc's pages before their first write ({got}): nothing to tell apart")
    assert got["resident"] == [0, 0], f"an operation mapped a page the constructor left unwritten: {got}"
