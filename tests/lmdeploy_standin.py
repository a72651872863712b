"""A stand-in LMDeploy for the calibration and history tests: a tiny package laid out as LMDeploy's PyTorch engine
is (``lmdeploy/pytorch/paging/block_manager/{base,default}_block_manager.py``, ``lmdeploy/pytorch/block.py``, a
``messages.py`` and package ``__init__`` files that must never run), with the interface
``harness.engines.lmdeploy_engine`` drives. Written for the tests, not taken from LMDeploy: free ids in a Python list,
ref counts and the logical-to-physical map in NumPy arrays, a list-backed table per sequence.

What ``num_required_blocks`` reads off a sequence moved between LMDeploy's releases and moves here with
:func:`write_lmdeploy`'s ``reads``: ``num_all_tokens()`` (up to 0.10.0), ``num_all_ids`` (later), and the chunk limit
``kv_token_limit`` (from 0.15.0).
"""

from __future__ import annotations

from pathlib import Path

from tests.calibration_standin import build_wheel

INIT = 'raise ImportError("the stand-in package\'s __init__ ran: the calibration must not run an engine\'s __init__")\n'
MESSAGES = 'raise ImportError("the stand-in messages.py ran: it imports torch and the engine; the plan stands in")\n'

BLOCK = '''import numpy as np


class LogicalTokenBlocks:
    def __init__(self):
        self._ids = []

    def __len__(self):
        return len(self._ids)

    def __setitem__(self, index, value):
        self._ids[index] = int(value)

    def get_real_blocks(self):
        return np.array(self._ids, dtype=np.int64)

    def append(self, blocks):
        self._ids.extend(int(b) for b in blocks)

    def reset(self):
        self._ids = []

    def clone(self):
        out = LogicalTokenBlocks()
        out.append(self._ids)
        return out
'''

BASE = '''import numpy as np

from ...messages import SchedulerSequence


class _Memory:
    def __init__(self, n):
        self.phy_map = np.arange(n, dtype=np.int64)
        self.ref_count = np.zeros(n, dtype=np.int64)


class _Physical:
    def __init__(self, n):
        self._free_count = n

    def get_num_free_blocks(self):
        return self._free_count


class LogicalAllocator:
    def __init__(self, num_blocks):
        self._log_mem = _Memory(num_blocks)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._gpu = _Physical(num_blocks)

    def get_phy_allocator(self, device):
        return self._gpu

    def allocate(self, num_blocks, device="gpu"):
        if num_blocks > len(self._free):
            raise MemoryError("No enough free memory blocks.")
        ids = np.array([self._free.pop() for _ in range(num_blocks)], dtype=np.int64)
        self._log_mem.ref_count[ids] = 1
        self._gpu._free_count -= num_blocks
        return ids

    def add_ref_count(self, blocks, value):
        np.add.at(self._log_mem.ref_count, blocks, value)

    def get_ref_count(self, blocks):
        return self._log_mem.ref_count[blocks]

    def get_physical_blocks(self, blocks):
        return self._log_mem.phy_map[blocks]

    def free(self, blocks):
        self.add_ref_count(blocks, -1)
        for b in blocks[self._log_mem.ref_count[blocks] == 0]:
            self._free.append(int(b)){BUG}
            self._gpu._free_count += 1


class BaseBlockManager:
    def __init__(self, num_gpu_blocks, num_cpu_blocks):
        self.allocator = LogicalAllocator(num_gpu_blocks)

    def allocate(self, data: SchedulerSequence, prealloc_size=0):
        return self.allocate_msg(data, prealloc_size)

    def get_block_table(self, msg: SchedulerSequence):
        return self.allocator.get_physical_blocks(msg.logical_blocks.get_real_blocks())

    def get_num_free_gpu_blocks(self):
        return self.allocator.get_phy_allocator("gpu").get_num_free_blocks()
'''
LEAK = "\n            self._free.append(int(b))  # leaked twice"

DEFAULT = '''from ...messages import SchedulerSequence
from .base_block_manager import BaseBlockManager


class DefaultBlockManager(BaseBlockManager):
    @classmethod
    def num_required_blocks(cls, obj: SchedulerSequence, prealloc_size=0):
        num_tokens = {TOKENS}
        num_tokens += prealloc_size
        return max(0, -(-num_tokens // obj.block_size) - len(obj.logical_blocks))

    def allocate_msg(self, msg, prealloc_size=0):
        n = self.num_required_blocks(msg, prealloc_size)
        if n > 0:
            msg.logical_blocks.append(self.allocator.allocate(n, "gpu"))

    def free(self, msg):
        self.allocator.free(msg.logical_blocks.get_real_blocks())
        msg.logical_blocks.reset()
'''
TOKENS = {"method": "obj.num_all_tokens()", "property": "obj.num_all_ids",
          "limit": "obj.num_all_ids if obj.kv_token_limit is None else min(obj.num_all_ids, obj.kv_token_limit)"}

# what num_required_blocks reads, as each stand-in release has it (lmdeploy_engine.ERAS' layouts)
LAYOUTS = {"0.10.0": "method", "0.12.0": "property", "0.15.0": "limit"}


def write_lmdeploy(root: Path, reads: str = "limit", leak: bool = False) -> Path:
    """The stand-in under ``root`` (which it returns): ``num_required_blocks`` reading ``reads`` (a key of
    :data:`TOKENS`); ``leak``: a free hands a block back twice."""
    files = {"lmdeploy/__init__.py": INIT, "lmdeploy/pytorch/__init__.py": INIT,
             "lmdeploy/pytorch/messages.py": MESSAGES, "lmdeploy/pytorch/block.py": BLOCK,
             "lmdeploy/pytorch/paging/__init__.py": INIT, "lmdeploy/pytorch/paging/block_manager/__init__.py": INIT,
             "lmdeploy/pytorch/paging/block_manager/base_block_manager.py": BASE.replace("{BUG}",
                                                                                          LEAK if leak else ""),
             "lmdeploy/pytorch/paging/block_manager/default_block_manager.py": DEFAULT.replace("{TOKENS}",
                                                                                                TOKENS[reads])}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def lmdeploy_wheels(tmp: Path, layouts: dict[str, str] = LAYOUTS) -> Path:
    """A folder of stand-in LMDeploy wheels, one per release of ``layouts`` (for ``--find-links``)."""
    dist = tmp / "dist"
    for version, reads in layouts.items():
        build_wheel(write_lmdeploy(tmp / f"src-{version}", reads), "lmdeploy", version, dist)
    return dist
