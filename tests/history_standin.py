"""A stand-in vLLM for the history tests: a tiny package laid out as vLLM v1's KV-cache manager is
(``vllm/v1/core/kv_cache_manager.py``, ``kv_cache_utils.py``, ``vllm/v1/kv_cache_interface.py``, ``vllm/v1/request.py``,
a package ``__init__`` that must never run), with the interface ``harness.engines.vllm_engine`` drives. Written for
the tests, not taken from vLLM: a free deque of blocks (block 0 the null block), a block list per request.

Three things moved between vLLM's releases and move here with :func:`write_vllm`'s flags: whether ``Request`` takes
``eos_token_id`` (up to 0.16.0), whether ``KVCacheManager`` takes ``scheduler_block_size`` (from 0.23.0) and whether
``get_computed_blocks`` answers a third value (from 0.26.0).
"""

from __future__ import annotations

from pathlib import Path

from tests.calibration_standin import build_wheel

INIT = 'raise ImportError("the stand-in package\'s __init__ ran: history must not run an engine\'s __init__")\n'

INTERFACE = '''from dataclasses import dataclass, field


@dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: object


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: FullAttentionSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list = field(default_factory=list)
    kv_cache_groups: list = field(default_factory=list)
'''

UTILS = '''def make_block_hash_with_group_id(block_hash, group_id):
    return block_hash + group_id.to_bytes(4, "little")
'''

REQUEST = '''import enum


class RequestStatus(enum.IntEnum):
    WAITING = 1
    RUNNING = 2


class Request:
    def __init__(self, request_id, prompt_token_ids, sampling_params, pooling_params, {EOS}block_hasher=None):
        self.request_id = request_id
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.block_hashes = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def num_tokens(self):
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_ids):
        self.all_token_ids.append(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self):
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))
'''

MANAGER = '''from collections import defaultdict, deque

from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.request import Request


class KVCacheBlock:
    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_cnt = 0


class BlockHashToBlockMap(dict):
    def get_one_block(self, key):
        return self.get(key)


class BlockPool:
    def __init__(self, num_blocks):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_blocks = deque(self.blocks[1:])
        self.cached_block_hash_to_block = BlockHashToBlockMap()

    def get_num_free_blocks(self):
        return len(self.free_blocks)


class SingleTypeManager:
    def __init__(self):
        self.req_to_blocks = defaultdict(list)


class Coordinator:
    def __init__(self):
        self.single_type_managers = [SingleTypeManager()]


class KVCacheManager:
    def __init__(self, kv_cache_config, max_model_len, {SIZES}enable_caching=True):
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(kv_cache_config.num_blocks)
        self.coordinator = Coordinator()

    def get_computed_blocks(self, request: Request):
        return {COMPUTED}

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None):
        blocks = self.coordinator.single_type_managers[0].req_to_blocks[request.request_id]
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        need = -(-total // self.block_size) - len(blocks)
        if need > len(self.block_pool.free_blocks):
            return None
        for _ in range(need):
            block = self.block_pool.free_blocks.popleft()
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def free(self, request):
        for block in reversed(self.coordinator.single_type_managers[0].req_to_blocks.pop(request.request_id, [])):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.block_pool.free_blocks.append(block)

    def cache_blocks(self, request, num_computed_tokens):
        key = make_block_hash_with_group_id(request.block_hashes[-1], 0)
        self.block_pool.cached_block_hash_to_block[key] = None
'''


def write_vllm(root: Path, scheduler_block_size: bool, three: bool, eos: bool = False) -> Path:
    """The stand-in under ``root``: ``scheduler_block_size`` taken or not, two or three values from
    ``get_computed_blocks``, ``Request`` with ``eos_token_id`` (up to 0.16) or without."""
    sizes = "scheduler_block_size, hash_block_size, " if scheduler_block_size else "hash_block_size, "
    manager = MANAGER.replace("{SIZES}", sizes).replace("{COMPUTED}", "[], 0, 0" if three else "[], 0")
    request = REQUEST.replace("{EOS}", "eos_token_id, " if eos else "")
    files = {"vllm/__init__.py": INIT, "vllm/v1/kv_cache_interface.py": INTERFACE, "vllm/v1/request.py": request,
             "vllm/v1/core/kv_cache_utils.py": UTILS, "vllm/v1/core/kv_cache_manager.py": manager}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# (scheduler_block_size, three values, eos_token_id) as each stand-in release has them (vllm_engine.ERAS' layouts)
LAYOUTS = {"0.16.0": (False, False, True), "0.22.1": (False, False, False), "0.25.1": (True, False, False),
           "0.26.0": (True, True, False)}


def vllm_wheels(tmp: Path, layouts: dict[str, tuple[bool, bool, bool]] = LAYOUTS) -> Path:
    """A folder of stand-in vLLM wheels, one per release of ``layouts`` (for ``--find-links``)."""
    dist = tmp / "dist"
    for version, flags in layouts.items():
        build_wheel(write_vllm(tmp / f"src-{version}", *flags), "vllm", version, dist)
    return dist


# vLLM's final releases from 0.12.0 to 0.34.0 as PyPI lists them (2026-12-06): every one has a plan, none between two
PUBLISHED_VLLM = ["0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0",
                  "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0",
                  "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0",
                  "0.32.0", "0.33.0", "0.34.0"]
