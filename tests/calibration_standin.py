"""A stand-in engine for the calibration tests: a tiny package laid out as nano-vllm is (``nanovllm/engine/
block_manager.py``, ``nanovllm/engine/sequence.py``, ``nanovllm/sampling_params.py``, a package ``__init__`` that
must never run), with the interface the calibration's adapter drives. Written for the tests, not taken from
nano-vllm: a deque of free block ids, blocks with ref counts and hashes, a block table per sequence.

:func:`write_standin` writes it into a folder, which ``kvblock-bench calibrate nano-vllm --source FOLDER`` then
imports exactly as it imports the real one. :func:`build_wheel` packs a folder into a wheel for the pip path.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

INIT = '''raise ImportError("the stand-in package's __init__ ran: the calibration must not run an engine's __init__")
'''

SAMPLING_PARAMS = '''from dataclasses import dataclass


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
'''

SEQUENCE = '''from itertools import count

from nanovllm.sampling_params import SamplingParams


class Sequence:
    block_size = 256
    counter = count()

    def __init__(self, token_ids, sampling_params=SamplingParams()):
        self.seq_id = next(Sequence.counter)
        self.status = None
        self.token_ids = list(token_ids)
        self.last_token = token_ids[-1]
        self.num_tokens = len(self.token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.is_prefill = True
        self.block_table = []

    def __len__(self):
        return self.num_tokens

    @property
    def num_blocks(self):
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self):
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    def block(self, i):
        return self.token_ids[i * self.block_size: (i + 1) * self.block_size]

    def append_token(self, token_id):
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1
'''

BLOCK_MANAGER = '''import hashlib
from collections import deque

from nanovllm.engine.sequence import Sequence


class Block:
    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids = []


class BlockManager:
    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id = {}
        self.free_block_ids = deque(range(num_blocks))
        self.used_block_ids = set()

    @classmethod
    def compute_hash(cls, token_ids, prefix=-1):
        data = repr((prefix, list(token_ids))).encode()
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")

    def _allocate_block(self):
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        block.ref_count, block.hash, block.token_ids = 1, -1, []
        self.used_block_ids.add(block_id)
        return block_id

    def can_allocate(self, seq: Sequence):
        if seq.num_blocks > 1:
            h = self.compute_hash(seq.block(0))
            hit = self.hash_to_block_id.get(h, -1)
            if hit != -1 and self.blocks[hit].token_ids == seq.block(0):
                return 1
        return 0 if len(self.free_block_ids) >= seq.num_blocks else -1

    def allocate(self, seq, num_cached_blocks):
        for _ in range(seq.num_blocks):
            seq.block_table.append(self._allocate_block())

    def deallocate(self, seq):
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.used_block_ids.remove(block_id)
                self.free_block_ids.append(block_id)
        seq.block_table.clear()

    def can_append(self, seq):
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq):
        if len(seq) % self.block_size == 1:
            seq.block_table.append(self._allocate_block()){BUG}

    def hash_blocks(self, seq):
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        h = self.blocks[seq.block_table[start - 1]].hash if start > 0 else -1
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            h = self.compute_hash(seq.block(i), h)
            block.hash, block.token_ids = h, seq.block(i)
            self.hash_to_block_id[h] = block.block_id
'''

# A bug the trace checks must catch: every sixteenth sequence-step takes a block it never uses.
LEAK = '''
        elif len(seq) % self.block_size == 5:
            seq.block_table.append(self._allocate_block())'''


def write_standin(root: Path, leak: bool = False) -> Path:
    """The stand-in package under ``root`` (which it returns); ``leak``: with the bug above."""
    files = {"nanovllm/__init__.py": INIT, "nanovllm/sampling_params.py": SAMPLING_PARAMS,
             "nanovllm/engine/sequence.py": SEQUENCE,
             "nanovllm/engine/block_manager.py": BLOCK_MANAGER.replace("{BUG}", LEAK if leak else "")}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def build_wheel(source: Path, dist: str, version: str, out: Path, pattern: str = "*.py") -> Path:
    """A minimal wheel of the files under ``source`` named by ``pattern`` (the ``.py`` files by default), with its
    RECORD (what ``pip download`` fetches and we unpack)."""
    out.mkdir(parents=True, exist_ok=True)
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    wheel = out / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in sorted(source.rglob(pattern)):
            name, data = path.relative_to(source).as_posix(), path.read_bytes()
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}\n")
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "".join(record) + f"{info}/RECORD,,\n")
    return wheel
