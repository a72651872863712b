"""A stand-in LMDeploy for the calibration and history tests: a tiny package laid out as LMDeploy's PyTorch engine
is (``lmdeploy/pytorch/paging/block_manager/{base,default}_block_manager.py``, ``lmdeploy/pytorch/block.py``, a
``messages.py`` and package ``__init__`` files that must never run), with the interface
``harness.engines.lmdeploy_engine`` drives. Written for the tests, not taken from LMDeploy: free ids in a Python list,
ref counts and the logical-to-physical map in NumPy arrays, a list-backed table per sequence.

What ``num_required_blocks`` reads off a sequence moved between LMDeploy's releases and moves here with
:func:`write_lmdeploy`'s ``reads``: ``num_all_tokens()`` (up to 0.10.0), ``num_all_ids`` (later), and the chunk limit
``kv_token_limit`` (from 0.15.0). The block trie (``paging/block_trie/``, 0.16.0 on) is a plain one: full blocks
keyed by their token ids, a reference each, leaves evicted least recently accessed first. Before 0.16.0 the trie is
the module ``paging/block_trie.py`` (:data:`OLD_TRIE`, the same plain trie behind the older interface), laid out as
:data:`TRIES` names: the cursor on the table, the bound ``num_all_ids`` (``"table-all"``, up to 0.10.0) or
``num_valid_ids`` (``"table"``), or the cursor in ``seq.prefix_cache`` with a key method (``"prefix_cache"``).
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
        self.last_shared_node = None

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
        self.last_shared_node = None

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
        self.access_time = np.zeros(n, dtype=np.int64)


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
        self.update_access_time(ids)
        self._gpu._free_count -= num_blocks
        return ids

    def update_access_time(self, blocks):
        for b in blocks[::-1]:  # a counter, not a clock; later ids in a call older
            self._clock = getattr(self, "_clock", 0) + 1
            self._log_mem.access_time[b] = self._clock

    def get_access_time(self, blocks):
        return self._log_mem.access_time[blocks]

    def add_ref_count(self, blocks, value):
        np.add.at(self._log_mem.ref_count, blocks, value)

    def get_ref_count(self, blocks):
        return self._log_mem.ref_count[blocks]

    def get_physical_blocks(self, blocks):
        return self._log_mem.phy_map[blocks]

    def free(self, blocks):
        self.add_ref_count(blocks, -1)
        self.update_access_time(blocks)
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
NODE = '''class Node:
    def __init__(self, {KEY_FIELD}, {BLOCK}, {TOKENS}, {LEN}, parent):
        self.{KEY_FIELD}, self.{BLOCK}, self.{TOKENS}, self.{LEN} = {KEY_FIELD}, {BLOCK}, {TOKENS}, {LEN}
        self.parent = parent
        self.children = {}
'''
# the trie's methods, over the names its layout gives a node's fields, the cursor and the bounds
TRIE_METHODS = '''
    def match(self, seq):
        node = {CURSOR} or self.{ROOT}(seq.adapter_name)
        hits = []
        while node.{LEN} + self.block_size < seq.{BOUND}:
            _, tokens, child = self._child(seq, node)
            if child is None or not np.array_equal(child.{TOKENS}, tokens):
                break
            hits.append(child.{BLOCK})
            node = child
        if hits:
            ids = np.array(hits, dtype=np.int64)
            self.allocator.update_access_time(ids)
            self.allocator.add_ref_count(ids, 1)
            seq.logical_blocks.append(ids)
            seq.set_step(node.{LEN})
        {CURSOR} = node

    def allocate(self, seq):
        node = {CURSOR} or self.{ROOT}(seq.adapter_name)
        n = seq.{BOUND} if seq.kv_token_limit is None else min(seq.{BOUND}, seq.kv_token_limit)
        new = []
        while node.{LEN} + self.block_size <= n:
            key, tokens, child = self._child(seq, node)
            if child is None:
                block = int(seq.logical_blocks.get_real_blocks()[node.{LEN} // self.block_size])
                child = Node(key, block, tokens.copy(), node.{LEN} + self.block_size, node)
                node.children[key] = child
                new.append(block)
            node = child
        if new:
            self.allocator.add_ref_count(np.array(new, dtype=np.int64), 1)
        {CURSOR} = node

    def _leaves(self):
        todo, out = list(self._roots.values()), []
        while todo:
            node = todo.pop()
            todo.extend(node.children.values())
            if node.parent is not None and not node.children:
                out.append(node)
        return out

    def evict(self, max_num_blocks):
        evicted = []
        while len(evicted) < max_num_blocks:
            alloc = self.allocator
            leaves = [n for n in self._leaves() if alloc.get_ref_count(np.array([n.{BLOCK}]))[0] == 1]
            if not leaves:
                break
            leaf = min(leaves, key=lambda n: alloc.get_access_time(np.array([n.{BLOCK}]))[0])
            del leaf.parent.children[leaf.{KEY_FIELD}]
            evicted.append(leaf.{BLOCK})
        if evicted:
            self.allocator.free(np.array(evicted, dtype=np.int64))
        return len(evicted)
'''
TRIE = '''import numpy as np


{NODE}

class BlockTrie:
    """Full blocks keyed by their token ids under a root; each holds one reference; leaves held by the trie alone
    are evicted least recently accessed first."""

    def __init__(self, *, allocator, block_size, enabled, checkpoint_state_manager=None):
        self.allocator, self.block_size, self.enabled = allocator, block_size, enabled
        self._roots = {}

    def _get_or_create_root(self, adapter_name):
        return self._roots.setdefault(adapter_name, Node(None, -1, None, 0, None))

    @staticmethod
    def _hash_block(token_ids, extra_identity):
        return hash((tuple(int(t) for t in token_ids), extra_identity))

    def _child(self, seq, node):
        start = node.prefix_len
        tokens = seq.history_cache[start:start + self.block_size]
        key = self._hash_block(tokens, seq.get_prefix_cache_extra_identity(start, start + self.block_size))
        return key, tokens, node.children.get(key)
''' + TRIE_METHODS
PACKAGE = {"{CURSOR}": "seq.prefix_cache.trie_cursor", "{ROOT}": "_get_or_create_root", "{LEN}": "prefix_len",
           "{BOUND}": "num_valid_ids", "{TOKENS}": "token_ids", "{BLOCK}": "block_id", "{KEY_FIELD}": "key"}
OLD_TRIE = '''import numpy as np

from lmdeploy.pytorch.messages import SchedulerSequence

from ..config import CacheConfig
from .block_manager import BaseBlockManager
{LOGGER}

{NODE}

class BlockTrie:
    """The package's plain trie behind the module's interface: built from a cache config and the block manager."""

    def __init__(self, cache_config: CacheConfig, block_manager: BaseBlockManager):
        self.allocator = block_manager.allocator
        self.block_size = cache_config.block_size
        self.enable = cache_config.enable_prefix_caching
        self._roots = {}

    def get_root(self, adapter_name):
        return self._roots.setdefault(adapter_name, Node(-1, -1, None, 0, None))
{KEY_METHOD}
    def _child(self, seq: SchedulerSequence, node):
        start = node.num_matched
        tokens = seq.history_cache[start:start + self.block_size]
        key = {KEY}
        return key, tokens, node.children.get(key)
''' + TRIE_METHODS
KEY_METHOD = '''
    @staticmethod
    def _make_key(tokens, extra_hashes):
        return hash(("random", tuple(tokens), extra_hashes))
'''
OLD = {"{ROOT}": "get_root", "{LEN}": "num_matched", "{TOKENS}": "tokens", "{BLOCK}": "block",
       "{KEY_FIELD}": "hash_key"}
TABLE = {**OLD, "{CURSOR}": "seq.logical_blocks.last_shared_node", "{KEY}": 'hash(("random", tuple(tokens)))',
         "{KEY_METHOD}": "", "{LOGGER}": ""}
# each layout of the trie module: what its placeholders become
OLD_TRIES = {
    "table-all": {**TABLE, "{BOUND}": "num_all_ids"}, "table": {**TABLE, "{BOUND}": "num_valid_ids"},
    "prefix_cache": {**OLD, "{CURSOR}": "seq.prefix_cache.last_shared_node", "{BOUND}": "num_valid_ids",
                     "{KEY}": "self._make_key(tokens, seq.get_prefix_cache_extra_hashes(start, start + "
                              "self.block_size))", "{KEY_METHOD}": KEY_METHOD,
                     "{LOGGER}": "\nfrom lmdeploy.utils import get_logger\n\nlogger = get_logger(\"lmdeploy\")\n"}}
PREFIX_CACHE_STATE = '''class PrefixCacheState:
    def __init__(self):
        self.trie_cursor = None
'''
TOKENS = {"method": "obj.num_all_tokens()", "property": "obj.num_all_ids",
          "limit": "obj.num_all_ids if obj.kv_token_limit is None else min(obj.num_all_ids, obj.kv_token_limit)"}

# what num_required_blocks reads, as each stand-in release has it (lmdeploy_engine.ERAS' layouts)
LAYOUTS = {"0.10.0": "method", "0.12.0": "property", "0.15.0": "limit"}
# the trie's layout of each stand-in release: a key of OLD_TRIES, or the package (0.16.0 on)
TRIES = {"0.10.0": "table-all", "0.12.0": "table", "0.15.0": "prefix_cache"}
RAISES = 'raise ImportError("the stand-in {} ran: the plan stands in for it")\n'


def _fill(text: str, marks: dict[str, str]) -> str:
    text = text.replace("{NODE}", NODE)
    for mark, value in marks.items():
        text = text.replace(mark, value)
    return text


def _trie_files(trie: str) -> dict[str, str]:
    if trie == "package":
        return {"lmdeploy/pytorch/prefix_cache_state.py": PREFIX_CACHE_STATE,
                "lmdeploy/pytorch/paging/block_trie/__init__.py": "from .trie import BlockTrie\n",
                "lmdeploy/pytorch/paging/block_trie/trie.py": _fill(TRIE, PACKAGE)}
    text = _fill(OLD_TRIE, OLD_TRIES[trie])
    return {"lmdeploy/pytorch/paging/block_trie.py": text, "lmdeploy/pytorch/config.py": RAISES.format("config.py"),
            "lmdeploy/utils.py": RAISES.format("utils.py")}


def write_lmdeploy(root: Path, reads: str = "limit", leak: bool = False, trie: str = "package") -> Path:
    """The stand-in under ``root`` (which it returns): ``num_required_blocks`` reading ``reads`` (a key of
    :data:`TOKENS`); ``leak``: a free hands a block back twice; ``trie``: the trie's layout (a key of
    :data:`OLD_TRIES`, or ``"package"``)."""
    files = {"lmdeploy/__init__.py": INIT, "lmdeploy/pytorch/__init__.py": INIT,
             "lmdeploy/pytorch/messages.py": MESSAGES, "lmdeploy/pytorch/block.py": BLOCK,
             "lmdeploy/pytorch/paging/__init__.py": INIT, "lmdeploy/pytorch/paging/block_manager/__init__.py": INIT,
             "lmdeploy/pytorch/paging/block_manager/base_block_manager.py": BASE.replace("{BUG}",
                                                                                          LEAK if leak else ""),
             "lmdeploy/pytorch/paging/block_manager/default_block_manager.py": DEFAULT.replace("{TOKENS}",
                                                                                                TOKENS[reads]),
             **_trie_files(trie)}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def lmdeploy_wheels(tmp: Path, layouts: dict[str, str] = LAYOUTS) -> Path:
    """A folder of stand-in LMDeploy wheels, one per release of ``layouts`` (for ``--find-links``), each with the
    trie's layout :data:`TRIES` gives its release (the package where it names none)."""
    dist = tmp / "dist"
    for version, reads in layouts.items():
        src = write_lmdeploy(tmp / f"src-{version}", reads, trie=TRIES.get(version, "package"))
        build_wheel(src, "lmdeploy", version, dist)
    return dist
