"""Decode traces: the contract calls a scheduler issues, step by step, as flat NumPy arrays.

A trace is three parallel op arrays (``op``, ``a0``, ``a1``) cut into steps by ``step_offsets``. Within a
step the pool operations (``FREE``, ``CAN_ALLOCATE``, ``ALLOCATE``, ``FORK``) come first and the decode
appends last, from ``decode_offsets[s]`` to ``step_offsets[s + 1]``: the batched regime hands exactly that
slice of ``a0`` to ``decode_step``. A compiled replay can walk the arrays without any Python object.

Each trace carries what a correct replay must end with (free count, every live row's length and its block
table up to renaming of block ids) and the number of copy-on-writes of every step, so a replay is checked,
not trusted. Files are ``.npz`` with a JSON header and a SHA-256 checksum over header and arrays; loading
checks format version, structure and checksum before anything is replayed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "kvblock-bench-trace"
FORMAT_VERSION = 2

# Op codes; a0/a1 per op:
CAN_ALLOCATE = 0  # a0 = blocks asked for, a1 = the answer the scheduler got (1/0)
ALLOCATE = 1  # a0 = row, a1 = tokens
FORK = 2  # a0 = parent row, a1 = child row
FREE = 3  # a0 = row
APPEND = 4  # a0 = row (decode appends, the last part of each step)
OP_NAMES = {CAN_ALLOCATE: "can_allocate", ALLOCATE: "allocate", FORK: "fork", FREE: "free", APPEND: "append"}

ARRAYS = {  # name -> dtype
    "op": np.uint8,
    "a0": np.int32,
    "a1": np.int32,
    "step_offsets": np.int64,
    "decode_offsets": np.int64,
    "step_cows": np.int32,
    "final_lens": np.int32,
    "final_canon": np.int32,
}
HEADER_KEYS = {
    "format", "version", "scenario", "generator_version", "params", "seed", "config", "num_steps", "num_ops",
    "num_requests", "peak_blocks_in_use", "cow_count", "preemptions", "final_free", "live_at_end", "ops_by_kind",
    "checksum",
}


class TraceError(ValueError):
    """A trace file that cannot be used: truncated, corrupted, edited, or of another format version."""


@dataclass
class Trace:
    """A loaded or freshly generated trace. ``header["config"]`` holds the BlockManager arguments."""

    header: dict
    arrays: dict[str, np.ndarray] = field(repr=False)

    @property
    def config(self) -> dict:
        """Keyword arguments for an implementation's constructor."""
        return dict(self.header["config"])

    @property
    def num_steps(self) -> int:
        return int(self.header["num_steps"])

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    def decode_ids(self, step: int) -> np.ndarray:
        """Row ids the decode step of ``step`` appends to, in order (a view of ``a0``)."""
        return self.a0[int(self.decode_offsets[step]) : int(self.step_offsets[step + 1])]

    def running_per_step(self) -> np.ndarray:
        """Number of sequences decoding in each step."""
        return (self.step_offsets[1:] - self.decode_offsets).astype(np.int64)

    def summary(self) -> dict:
        """What ``kvblock-bench trace --show`` prints."""
        h = self.header
        running = self.running_per_step()
        return {
            "scenario": h["scenario"],
            "steps": h["num_steps"],
            "requests": h["num_requests"],
            "running per step (min/mean/max)": f"{running.min()}/{running.mean():.1f}/{running.max()}",
            "sequence-steps": int(running.sum()),
            "ops": h["num_ops"],
            **{f"ops {k}": v for k, v in h["ops_by_kind"].items()},
            "peak blocks in use": f"{h['peak_blocks_in_use']} of {h['config']['num_blocks']}",
            "copy-on-writes": h["cow_count"],
            "preemptions": h["preemptions"],
            "live at end": h["live_at_end"],
            "config": h["config"],
            "params": h["params"],
            "seed": h["seed"],
        }


def canonical_tables(tables: Mapping[int, Sequence[int]]) -> list[int]:
    """Block tables of the given rows (in row order), with ids renamed in order of first appearance.

    Two managers in the same state give the same list whatever ids their pools handed out; sharing
    (the same block in two tables) is preserved.
    """
    names: dict[int, int] = {}
    out: list[int] = []
    for row in sorted(tables):
        for block in tables[row]:
            out.append(names.setdefault(int(block), len(names)))
    return out


def _checksum(header: Mapping, arrays: Mapping[str, np.ndarray]) -> str:
    body = {k: v for k, v in header.items() if k != "checksum"}
    return _digest(json.dumps(body, sort_keys=True).encode(), arrays)


def content_digest(trace: Trace) -> str:
    """Identity of the work a trace asks for (configuration and ops), whatever its scenario is called."""
    return _digest(json.dumps(trace.header["config"], sort_keys=True).encode(), trace.arrays)


def _digest(prefix: bytes, arrays: Mapping[str, np.ndarray]) -> str:
    digest = hashlib.sha256(prefix)
    for name in sorted(ARRAYS):
        arr = np.ascontiguousarray(arrays[name], dtype=ARRAYS[name])
        digest.update(name.encode())
        digest.update(str(arr.shape).encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def finalize(header: dict, arrays: Mapping[str, np.ndarray]) -> Trace:
    """Cast arrays, stamp format, version and checksum, and validate: the one way a Trace is made."""
    arrays = {name: np.ascontiguousarray(arrays[name], dtype=dtype) for name, dtype in ARRAYS.items()}
    header = {**header, "format": FORMAT, "version": FORMAT_VERSION}
    header["checksum"] = _checksum(header, arrays)
    trace = Trace(header, arrays)
    validate(trace)
    return trace


def save(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = np.frombuffer(json.dumps(trace.header, sort_keys=True).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes owner-only files; keep the usual permissions
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, header=header, **trace.arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def load(path: str | os.PathLike) -> Trace:
    """Read and fully check a trace file; raises :class:`TraceError` naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        with np.load(path, allow_pickle=False) as data:
            contents = {name: data[name] for name in data.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError) as exc:
        raise TraceError(f"{path}: not a readable trace file (truncated or corrupted?): {exc}") from exc
    if "header" not in contents:
        raise TraceError(f"{path}: no header: not a kvblock-bench trace")
    try:
        header = json.loads(contents.pop("header").tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TraceError(f"{path}: not a kvblock-bench trace (format {header.get('format')!r})")
    if header.get("version") != FORMAT_VERSION:
        raise TraceError(
            f"{path}: trace format version {header.get('version')!r}, this kvblock-bench reads version "
            f"{FORMAT_VERSION}; regenerate it with `kvblock-bench trace`"
        )
    missing = sorted(set(ARRAYS) - set(contents))
    if missing:
        raise TraceError(f"{path}: missing arrays {missing}")
    trace = Trace(header, contents)
    try:
        validate(trace)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    return trace


def validate(trace: Trace) -> None:
    """Structure and checksum checks; raises :class:`TraceError`."""
    h, a = trace.header, trace.arrays
    missing = sorted(HEADER_KEYS - set(h))
    if missing:
        raise TraceError(f"header lacks {missing}")
    for name, dtype in ARRAYS.items():
        if a[name].dtype != np.dtype(dtype) or a[name].ndim != 1:
            raise TraceError(f"array {name!r} has dtype {a[name].dtype} and {a[name].ndim} dims, expected 1-D {dtype}")
    if h["checksum"] != _checksum(h, a):
        raise TraceError("checksum mismatch: the file was modified or damaged after it was written")
    steps, n_ops, cfg = h["num_steps"], h["num_ops"], h["config"]
    so, do = a["step_offsets"], a["decode_offsets"]
    if not (len(a["op"]) == len(a["a0"]) == len(a["a1"]) == n_ops):
        raise TraceError("op arrays disagree with num_ops")
    if len(so) != steps + 1 or len(do) != steps or len(a["step_cows"]) != steps:
        raise TraceError("step arrays disagree with num_steps")
    if so[0] != 0 or so[-1] != n_ops or np.any(np.diff(so) < 0) or np.any(do < so[:-1]) or np.any(do > so[1:]):
        raise TraceError("step offsets are not monotonic within the op arrays")
    if n_ops and a["op"].max() > APPEND:
        raise TraceError(f"unknown op code {int(a['op'].max())}")
    rows = a["op"] != CAN_ALLOCATE
    if np.any(rows) and (a["a0"][rows].min() < 0 or a["a0"][rows].max() >= cfg["max_seqs"]):
        raise TraceError("row ids outside [0, max_seqs)")
    edges = np.zeros(n_ops + 1, dtype=np.int64)  # +1 where a decode part starts, -1 where it ends
    np.add.at(edges, do, 1)
    np.add.at(edges, so[1:], -1)
    is_append = np.cumsum(edges)[:-1] > 0
    if np.any((a["op"] == APPEND) != is_append):
        raise TraceError("appends must be exactly the decode part of each step")
    if len(a["final_lens"]) != cfg["max_seqs"]:
        raise TraceError("final_lens must have one entry per row")
