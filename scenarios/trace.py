"""Decode traces: the contract calls a scheduler issues, step by step, as flat NumPy arrays.

A trace is three parallel op arrays (``op``, ``a0``, ``a1``) cut into steps by ``step_offsets``. Within a
step the pool operations (``FREE``, ``CAN_ALLOCATE``, ``ALLOCATE``, ``FORK``) come first and the decode
appends last, from ``decode_offsets[s]`` to ``step_offsets[s + 1]``: the batched regime hands exactly that
slice of ``a0`` to ``decode_step``. A compiled replay can walk the arrays without any Python object.

Each trace carries what a correct replay must end with (free count, every live row's length and its block
table up to renaming of block ids) and the number of copy-on-writes of every step, so a replay is checked,
not trusted. Files are ``.npz`` with a JSON header and a SHA-256 checksum over header and arrays; loading
checks format version, structure and checksum before anything is replayed.

Format 3 adds prefix caching (see :class:`impls.contract.CachingBlockManager`): ``ALLOCATE_CACHED`` and ``SEAL``
ops whose hash chains live in ``hashes`` (``op_hash`` indexes it per op, -1 for the other ops), the prompt tokens
the cache served in each step (``step_hits``) and the blocks evicted in each step (``step_evictions``), as the
reference model answered; the header's ``cache`` holds the totals. A ``SEAL`` is a pool op at the start of the
step after the decode that filled the block (before that step's frees). Format 2 files still load, as traces
without caching.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from impls.contract import (
    ALLOCATE,
    ALLOCATE_CACHED,
    APPEND,
    CAN_ALLOCATE,
    FORK,
    FREE,
    OP_NAMES,
    SEAL,
    blocks_for,
    check_config,
)

from .atomic import atomic_write
from .files import kind_of, write_target

FORMAT = "kvblock-bench-trace"
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)  # 2: before prefix caching, loaded as a trace without it

# Op codes (defined once, in impls.contract, which the whole-step entry point shares); a0/a1 per op:
# CAN_ALLOCATE a0 = blocks asked for, a1 = the answer the scheduler got (1/0); ALLOCATE a0 = row, a1 = tokens;
# FORK a0 = parent row, a1 = child row; FREE a0 = row; APPEND a0 = row (decode appends, the last part of each
# step). Prefix caching (format version 3; see impls.contract.CachingBlockManager), ``op_hash[i]`` indexes
# ``hashes``: ALLOCATE_CACHED a0 = row, a1 = tokens, chain = hashes[op_hash[i] : op_hash[i] + a1 // block_size];
# SEAL a0 = row, a1 = the answer seal() gave (1/0), hash = hashes[op_hash[i]].

ARRAYS = {  # name -> dtype
    "op": np.uint8,
    "a0": np.int32,
    "a1": np.int32,
    "step_offsets": np.int64,
    "decode_offsets": np.int64,
    "step_cows": np.int32,
    "final_lens": np.int32,
    "final_canon": np.int32,
    "hashes": np.uint64,  # format 3: the hash chains of ALLOCATE_CACHED ops and the hashes of SEAL ops
    "op_hash": np.int64,  # per op: index into hashes (ALLOCATE_CACHED, SEAL), else -1
    "step_hits": np.int32,  # per step: prompt tokens the cache served (the reference model's answers)
    "step_evictions": np.int32,  # per step: cached blocks evicted
}
V2_ARRAYS = ("op", "a0", "a1", "step_offsets", "decode_offsets", "step_cows", "final_lens", "final_canon")
V2_HEADER_KEYS = {
    "format", "version", "scenario", "generator_version", "params", "seed", "config", "num_steps", "num_ops",
    "num_requests", "peak_blocks_in_use", "cow_count", "preemptions", "final_free", "live_at_end", "ops_by_kind",
    "checksum",
}
HEADER_KEYS = V2_HEADER_KEYS | {"prefix_caching", "cache"}
# header["cache"]: totals over the trace (all 0 without prefix caching)
CACHE_KEYS = (
    "hashes",  # entries of the hashes array
    "lookup_tokens",  # prompt tokens of ALLOCATE_CACHED ops
    "lookup_blocks",  # full prompt blocks looked up (the chains' lengths)
    "hit_tokens",  # prompt tokens served from the cache (sum of step_hits)
    "hit_blocks",  # hit_tokens / block_size
    "evictions",  # cached blocks evicted (sum of step_evictions)
    "seals",  # SEAL ops
    "seals_cached",  # SEAL ops whose block became cached (a1 = 1)
)


class TraceError(ValueError):
    """A trace file that cannot be used: truncated, corrupted, edited, or of another format version."""


# Limits a file is held to before anything is decompressed (a few MB of zip may claim gigabytes).
MAX_HEADER_BYTES = 1 << 20  # the JSON header
MAX_TRACE_BYTES = 1 << 30  # all arrays together, in memory
MAX_POOL_BLOCKS = 1 << 24  # num_blocks of a trace's configuration
MAX_TABLE_ENTRIES = 1 << 28  # max_seqs * max_blocks_per_seq (a dense block table of that many int32)
REGENERATE = "regenerate it with `kvblock-bench trace`"
COUNT_FIELDS = ("num_steps", "num_ops", "num_requests", "peak_blocks_in_use", "cow_count", "preemptions",
                "final_free", "live_at_end", "generator_version", "seed")
CONFIG_KEYS = ("num_blocks", "block_size", "max_seqs", "max_blocks_per_seq")


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

    def chain(self, i: int) -> np.ndarray:
        """The hashes op ``i`` carries (a uint64 view of ``hashes``): an ``ALLOCATE_CACHED`` op's prompt chain,
        a ``SEAL`` op's one hash; empty for the other ops."""
        op, start = int(self.op[i]), int(self.op_hash[i])
        n = int(self.a1[i]) // self.config["block_size"] if op == ALLOCATE_CACHED else int(op == SEAL)
        return self.hashes[start : start + n] if start >= 0 else self.hashes[:0]

    def op_lengths(self) -> np.ndarray:
        """Per op, the length in tokens of the row it concerns, tracked through the trace (the one walk of row
        lengths): ``ALLOCATE``/``ALLOCATE_CACHED``: the prompt (``a1``); ``APPEND``: the row after the append;
        ``FREE``: the row as it was freed; ``FORK``: the parent's (the child's after the fork); ``CAN_ALLOCATE``:
        0; ``SEAL``: the row's."""
        lens = [0] * self.config["max_seqs"]
        out = np.zeros(len(self.op), dtype=np.int64)
        for i, (o, x, y) in enumerate(zip(self.op.tolist(), self.a0.tolist(), self.a1.tolist(), strict=True)):
            if o == APPEND:
                lens[x] += 1
            elif o in (ALLOCATE, ALLOCATE_CACHED):
                lens[x] = y
            elif o == FORK:
                lens[y] = lens[x]
            if o != CAN_ALLOCATE:
                out[i] = lens[x]
            if o == FREE:
                lens[x] = 0
        return out

    def cache_summary(self) -> dict:
        """The prefix-caching totals, with hit rates (tokens and blocks) and evictions per step."""
        c = self.header["cache"]

        def rate(hit: int, of: int) -> str:
            return f"{hit} of {of} ({100 * hit / of:.1f} %)" if of else f"{hit} of {of}"

        return {
            "prefix caching": self.header["prefix_caching"],
            "cache hit tokens": rate(c["hit_tokens"], c["lookup_tokens"]),
            "cache hit blocks": rate(c["hit_blocks"], c["lookup_blocks"]),
            "cache evictions": f"{c['evictions']} ({c['evictions'] / self.num_steps:.2f} per step)",
            "cache seals": f"{c['seals']} ({c['seals_cached']} cached)",
        }

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
            **self.cache_summary(),
            "config": h["config"],
            "params": h["params"],
            "seed": h["seed"],
        }


def trace_uses_caching(trace: Trace) -> bool:
    """Whether ``trace`` holds prefix-caching ops (``ALLOCATE_CACHED``, ``SEAL``): only a manager with prefix caching
    (:func:`impls.contract.supports_prefix_caching`) and a driver that knows these ops can replay it."""
    return bool(trace.header.get("prefix_caching", False))


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


def _checksum(header: Mapping, arrays: Mapping[str, np.ndarray], names: Iterable[str] = ARRAYS) -> str:
    body = {k: v for k, v in header.items() if k != "checksum"}
    return _digest(json.dumps(body, sort_keys=True).encode(), arrays, names)


def content_digest(trace: Trace) -> str:
    """Identity of the work a trace asks for (configuration and ops), whatever its scenario is called."""
    return _digest(json.dumps(trace.header["config"], sort_keys=True).encode(), trace.arrays)


def _digest(prefix: bytes, arrays: Mapping[str, np.ndarray], names: Iterable[str] = ARRAYS) -> str:
    digest = hashlib.sha256(prefix)
    for name in sorted(names):
        arr = np.ascontiguousarray(arrays[name], dtype=ARRAYS[name])
        digest.update(name.encode())
        digest.update(str(arr.shape).encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def finalize(header: dict, arrays: Mapping[str, np.ndarray]) -> Trace:
    """Cast arrays, stamp format, version, the cache totals and checksum, and validate: the one way a Trace is
    made."""
    arrays = {name: np.ascontiguousarray(arrays[name], dtype=dtype) for name, dtype in ARRAYS.items()}
    header = {**header, "format": FORMAT, "version": FORMAT_VERSION,
              **cache_totals(arrays, header["config"]["block_size"])}
    header["checksum"] = _checksum(header, arrays)
    trace = Trace(header, arrays)
    validate(trace)
    return trace


def cache_totals(arrays: Mapping[str, np.ndarray], block_size: int) -> dict:
    """The header's ``prefix_caching`` flag and ``cache`` totals, from the arrays."""
    op, a1 = arrays["op"], arrays["a1"].astype(np.int64)
    cached, sealed = op == ALLOCATE_CACHED, op == SEAL
    hit_tokens = int(arrays["step_hits"].sum())
    cache = {"hashes": len(arrays["hashes"]), "lookup_tokens": int(a1[cached].sum()),
             "lookup_blocks": int((a1[cached] // block_size).sum()), "hit_tokens": hit_tokens,
             "hit_blocks": hit_tokens // block_size, "evictions": int(arrays["step_evictions"].sum()),
             "seals": int(sealed.sum()), "seals_cached": int(a1[sealed].sum())}
    return {"prefix_caching": bool(np.any(cached | sealed)), "cache": cache}


def check_writable(path: str | os.PathLike) -> Path:
    """Refuse an output path a trace cannot be written to; call it before the (long) simulation.

    The nearest existing folder above ``path`` must be a writable folder (``save`` creates the missing ones),
    and ``path`` itself must not be a folder, a device node, a FIFO or a socket (nothing but a regular file is
    ever replaced; a symbolic link is followed to its target, which is what is checked and written). Raises
    :class:`TraceError` naming the path and the fix.
    """
    path = Path(path)
    if path.is_dir():
        raise TraceError(f"{path}: is a folder; give a file name for the trace (-o {path / 'trace.npz'})")
    try:
        target = write_target(path)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}; give another output path (a regular file)") from None
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise TraceError(f"{path}: cannot write the trace: {folder} is not a folder; choose another output path")
    if folder == target.parent:  # the real test: create (and remove) a file where the trace will go
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".kvblock-bench.", suffix=".probe")
        except OSError as exc:
            raise TraceError(f"{path}: cannot write to {folder} ({exc.strerror}); choose another output path") from None
        os.close(fd)
        os.unlink(probe)
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise TraceError(f"{path}: cannot create folders in {folder} (permission denied); choose another output path")
    return path


def save(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` atomically (a temporary file renamed into place); :class:`TraceError` if it cannot."""
    path = check_writable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(trace, path)
    except OSError as exc:
        reason = exc.strerror or exc
        raise TraceError(f"{path}: cannot write the trace ({reason}); choose another output path") from None
    return path


def _write(trace: Trace, path: Path) -> None:
    header = np.frombuffer(json.dumps(trace.header, sort_keys=True).encode(), dtype=np.uint8)
    atomic_write(path, lambda fh: np.savez_compressed(fh, header=header, **trace.arrays))


# What a damaged zip can raise while it is read (zipfile, zlib and numpy's .npy reader).
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError, NotImplementedError,
                RuntimeError, struct.error, OverflowError, UnicodeDecodeError)


def load(path: str | os.PathLike) -> Trace:
    """Read and fully check a trace file; raises :class:`TraceError` naming what is wrong.

    Sizes are checked before anything is decompressed: the header (at most ``MAX_HEADER_BYTES``) is read
    first and validated, and each array's declared size and ``.npy`` shape must match the header's counts.
    """
    path = Path(path)
    kind = kind_of(path)
    if kind == "folder":
        raise TraceError(f"{path}: is a folder, not a trace file; give the .npz file written by `kvblock-bench trace`")
    if kind is None:
        raise TraceError(f"{path}: no such trace file")
    if kind != "regular file":  # a zip is read by seeking; a FIFO or a device could only be waited on
        raise TraceError(f"{path}: is a {kind}, not a trace file; save the trace to a regular file and give that")
    try:
        with zipfile.ZipFile(path) as zf:
            members = _members(zf)
            header = _read_header(zf, members)
            if header["version"] == 2:
                trace = _read_v2(zf, members, header)
            else:
                validate_header(header)
                arrays = {name: _read_array(zf, members, name, _expected_length(header, name)) for name in ARRAYS}
                trace = Trace(header, arrays)
        validate(trace)
    except TraceError as exc:
        fix = "" if "kvblock-bench" in str(exc) else f"; {REGENERATE}"
        raise TraceError(f"{path}: {exc}{fix}") from None
    except PermissionError:
        raise TraceError(f"{path}: cannot read the trace file (permission denied)") from None
    except _READ_ERRORS as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise TraceError(f"{path}: not a readable trace file (truncated or corrupted?): {reason}; "
                         f"{REGENERATE}") from None
    return trace


def _members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The zip's members by array name, after checks that need no decompression."""
    infos = zf.infolist()
    names = [info.filename for info in infos]
    if "header.npy" not in names:
        raise TraceError("no header: not a kvblock-bench trace")
    expected = {f"{name}.npy" for name in ["header", *ARRAYS]}  # a format 2 file holds a subset
    if len(set(names)) != len(names) or not set(names) <= expected:
        extra = sorted({n for n in names if n not in expected or names.count(n) > 1})
        raise TraceError(f"unexpected or repeated members {extra} in the zip; {REGENERATE}")
    for info in infos:
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or info.flag_bits & 0x61:
            raise TraceError(f"member {info.filename!r} is encrypted or uses an unsupported compression; {REGENERATE}")
    return {info.filename[: -len(".npy")]: info for info in infos}


def _read_header(zf: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo]) -> dict:
    info = members["header"]
    if info.file_size > MAX_HEADER_BYTES:
        raise TraceError(f"header of {info.file_size} bytes (at most {MAX_HEADER_BYTES}): not a kvblock-bench trace")
    raw = _read_array(zf, members, "header", None, np.uint8)
    try:
        header = json.loads(raw.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"header is not valid JSON: {exc}; {REGENERATE}") from None
    if not isinstance(header, dict):
        raise TraceError(f"header is a JSON {type(header).__name__}, not an object: not a kvblock-bench trace")
    if header.get("format") != FORMAT:
        raise TraceError(f"not a kvblock-bench trace (format {header.get('format')!r})")
    if header.get("version") not in READABLE_VERSIONS or isinstance(header.get("version"), bool):
        raise TraceError(
            f"trace format version {header.get('version')!r}, this kvblock-bench reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}; {REGENERATE}"
        )
    return header


def _read_v2(zf: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], header: dict) -> Trace:
    """A format 2 file (before prefix caching), checked as format 2 and returned as the format 3 trace without
    caching that it stands for (its checksum recomputed as format 3)."""
    if set(header) != V2_HEADER_KEYS:
        raise TraceError(f"format 2 header with fields {sorted(set(header) ^ V2_HEADER_KEYS)} wrong; {REGENERATE}")
    if extra := set(members) - {"header", *V2_ARRAYS}:
        raise TraceError(f"format 2 file with format 3 arrays {sorted(extra)}; {REGENERATE}")
    ops, caching = header["ops_by_kind"], (OP_NAMES[ALLOCATE_CACHED], OP_NAMES[SEAL])
    if isinstance(ops, dict):  # format 2 files made before the caching op codes existed lack their counts
        if counted := [name for name in caching if ops.get(name)]:
            raise TraceError(f"format 2 header counts prefix-caching ops {counted}; {REGENERATE}")
        ops = {**ops, **{name: ops.get(name, 0) for name in caching}}
    upgraded = {**header, "ops_by_kind": ops, "version": FORMAT_VERSION, "prefix_caching": False,
                "cache": dict.fromkeys(CACHE_KEYS, 0)}
    validate_header(upgraded)
    arrays = {name: _read_array(zf, members, name, _expected_length(upgraded, name)) for name in V2_ARRAYS}
    if header["checksum"] != _checksum(header, arrays, V2_ARRAYS):
        raise TraceError("checksum mismatch: the file was modified or damaged after it was written")
    if len(arrays["op"]) and int(arrays["op"].max()) > APPEND:
        raise TraceError(f"format 2 trace with op code {int(arrays['op'].max())} (format 2 has codes 0 to {APPEND})")
    n_ops, n_steps = upgraded["num_ops"], upgraded["num_steps"]
    arrays.update(hashes=np.zeros(0, np.uint64), op_hash=np.full(n_ops, -1, np.int64),
                  step_hits=np.zeros(n_steps, np.int32), step_evictions=np.zeros(n_steps, np.int32))
    upgraded["checksum"] = _checksum(upgraded, arrays)
    return Trace(upgraded, arrays)


def _expected_length(h: dict, name: str) -> int | tuple[int, int]:
    """Length an array must have by the (validated) header; a (low, high) range for ``final_canon``."""
    cfg = h["config"]
    lengths = {"op": h["num_ops"], "a0": h["num_ops"], "a1": h["num_ops"], "step_offsets": h["num_steps"] + 1,
               "decode_offsets": h["num_steps"], "step_cows": h["num_steps"], "final_lens": cfg["max_seqs"],
               "hashes": h["cache"]["hashes"], "op_hash": h["num_ops"], "step_hits": h["num_steps"],
               "step_evictions": h["num_steps"]}
    return lengths.get(name, (0, cfg["max_seqs"] * cfg["max_blocks_per_seq"]))


def _read_array(zf: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], name: str,
                length: int | tuple[int, int] | None, dtype: type | None = None) -> np.ndarray:
    """One ``.npy`` member, its dtype, shape and declared size checked before its data is read."""
    info, dtype = members.get(name), np.dtype(dtype or ARRAYS[name])
    if info is None:
        raise TraceError(f"missing array {name!r}; {REGENERATE}")
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version not in ((1, 0), (2, 0)):
            raise TraceError(f"array {name!r}: unsupported .npy version {version}; {REGENERATE}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, file_dtype = read_header(fh)
        n = _check_shape(name, shape, file_dtype, dtype, length)
        if info.file_size != fh.tell() + n * dtype.itemsize:
            raise TraceError(f"array {name!r}: the zip declares {info.file_size} bytes for {n} values; {REGENERATE}")
        out = np.empty(n, dtype=dtype)
        if fh.readinto(memoryview(out).cast("B")) != out.nbytes:
            raise TraceError(f"array {name!r} is truncated; {REGENERATE}")
    return out


def _check_shape(name: str, shape: tuple, file_dtype: np.dtype, dtype: np.dtype,
                 length: int | tuple[int, int] | None) -> int:
    if file_dtype != dtype or len(shape) != 1:
        raise TraceError(f"array {name!r} has dtype {file_dtype} and shape {shape}, expected 1-D {dtype}; {REGENERATE}")
    n = int(shape[0])
    low, high = (0, MAX_HEADER_BYTES) if length is None else (length, length) if isinstance(length, int) else length
    if not low <= n <= high:
        want = f"{low}" if low == high else f"between {low} and {high}"
        raise TraceError(f"array {name!r} holds {n} values, the header says {want}; {REGENERATE}")
    return n


def _require(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise TraceError(f"header field {field!r} {what}; {REGENERATE}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate_header(h: Mapping) -> None:
    """Schema of a header: fields, types, ranges and the configuration contract; raises :class:`TraceError`."""
    if not isinstance(h, Mapping):
        raise TraceError(f"header is a {type(h).__name__}, not a JSON object; {REGENERATE}")
    missing, unknown = sorted(HEADER_KEYS - set(h)), sorted(set(h) - HEADER_KEYS)
    if missing:
        raise TraceError(f"header lacks {missing}; {REGENERATE}")
    if unknown:
        raise TraceError(f"header has unknown fields {unknown}; {REGENERATE}")
    for key in ("scenario", "checksum"):
        _require(isinstance(h[key], str), key, f"must be a string, got {h[key]!r}")
    _require(re.fullmatch(r"[0-9a-f]{64}", h["checksum"]) is not None, "checksum", "must be 64 hex digits")
    for key in ("params", "config", "ops_by_kind"):
        _require(isinstance(h[key], dict), key, f"must be a JSON object, got {type(h[key]).__name__}")
    for key in COUNT_FIELDS:
        _require(_is_count(h[key]), key, f"must be an integer >= 0, got {h[key]!r}")
    _require(h["num_steps"] >= 1, "num_steps", "must be at least 1")
    _validate_config(h["config"])
    _validate_cache_header(h)
    _validate_counts(h)


def _validate_cache_header(h: Mapping) -> None:
    _require(isinstance(h["prefix_caching"], bool), "prefix_caching",
             f"must be true or false, got {h['prefix_caching']!r}")
    c = h["cache"]
    _require(isinstance(c, dict) and sorted(c) == sorted(CACHE_KEYS) and all(map(_is_count, c.values())), "cache",
             f"must give a count >= 0 for each of {sorted(CACHE_KEYS)}")
    _require(c["hit_tokens"] == c["hit_blocks"] * h["config"]["block_size"], "cache.hit_tokens",
             "must be cache.hit_blocks * block_size")
    _require(c["hit_blocks"] <= c["lookup_blocks"] and c["hit_tokens"] <= c["lookup_tokens"], "cache.hit_blocks",
             "must not exceed what was looked up")
    _require(c["seals_cached"] <= c["seals"], "cache.seals_cached", "must not exceed cache.seals")
    _require(h["prefix_caching"] or not any(c.values()), "cache", "must be all 0 in a trace without prefix caching")


def _validate_config(cfg: dict) -> None:
    _require(sorted(cfg) == sorted(CONFIG_KEYS), "config", f"must hold exactly {list(CONFIG_KEYS)}, got {sorted(cfg)}")
    try:
        check_config(**cfg)
    except ValueError as exc:
        raise TraceError(f"header field 'config': {exc}; {REGENERATE}") from None
    _require(cfg["num_blocks"] <= MAX_POOL_BLOCKS, "config.num_blocks", f"must be at most {MAX_POOL_BLOCKS}")
    _require(cfg["max_blocks_per_seq"] <= cfg["num_blocks"], "config.max_blocks_per_seq", "must not exceed num_blocks")
    _require(cfg["max_seqs"] * cfg["max_blocks_per_seq"] <= MAX_TABLE_ENTRIES, "config",
             f"max_seqs * max_blocks_per_seq must be at most {MAX_TABLE_ENTRIES}")


def _validate_counts(h: Mapping) -> None:
    cfg, ops = h["config"], h["ops_by_kind"]
    nbytes = (17 * h["num_ops"] + 28 * h["num_steps"] + 8 * h["cache"]["hashes"]
              + 4 * cfg["max_seqs"] * (1 + cfg["max_blocks_per_seq"]))
    _require(nbytes <= MAX_TRACE_BYTES, "num_ops", f"makes a trace of {nbytes} bytes, more than the {MAX_TRACE_BYTES} "
             "a trace may hold (fewer steps or sequences)")
    _require(sorted(ops) == sorted(OP_NAMES.values()) and all(map(_is_count, ops.values())), "ops_by_kind",
             f"must give a count >= 0 for each of {sorted(OP_NAMES.values())}")
    _require(sum(ops.values()) == h["num_ops"], "ops_by_kind", f"must add up to num_ops={h['num_ops']}")
    _require(h["peak_blocks_in_use"] <= cfg["num_blocks"], "peak_blocks_in_use", "must not exceed config.num_blocks")
    _require(h["final_free"] <= cfg["num_blocks"], "final_free", "must not exceed config.num_blocks")
    _require(h["live_at_end"] <= cfg["max_seqs"], "live_at_end", "must not exceed config.max_seqs")


def validate(trace: Trace) -> None:
    """Header schema, structure, checksum and end-state consistency; raises :class:`TraceError`."""
    h, a = trace.header, trace.arrays
    validate_header(h)
    for name, dtype in ARRAYS.items():
        if name not in a or a[name].dtype != np.dtype(dtype) or a[name].ndim != 1:
            raise TraceError(f"array {name!r} is missing or not a 1-D {np.dtype(dtype)} array")
    if h["checksum"] != _checksum(h, a):
        raise TraceError("checksum mismatch: the file was modified or damaged after it was written")
    _validate_steps(h, a)
    _validate_ops(h, a)
    _validate_cache(h, a)
    _validate_end_state(h, a)


def _validate_steps(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    steps, n_ops = h["num_steps"], h["num_ops"]
    so, do = a["step_offsets"], a["decode_offsets"]
    if not (len(a["op"]) == len(a["a0"]) == len(a["a1"]) == n_ops):
        raise TraceError("op arrays disagree with num_ops")
    if len(so) != steps + 1 or len(do) != steps or len(a["step_cows"]) != steps:
        raise TraceError("step arrays disagree with num_steps")
    if so[0] != 0 or so[-1] != n_ops or np.any(np.diff(so) < 0) or np.any(do < so[:-1]) or np.any(do > so[1:]):
        raise TraceError("step offsets are not monotonic within the op arrays")
    if np.any(a["step_cows"] < 0) or int(a["step_cows"].sum()) != h["cow_count"]:
        raise TraceError("step_cows disagree with cow_count")


def _validate_ops(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    cfg, op, a0, a1 = h["config"], a["op"], a["a0"], a["a1"]
    if len(op) and op.max() > SEAL:
        raise TraceError(f"unknown op code {int(op.max())}")
    counts = np.bincount(op, minlength=len(OP_NAMES))
    if any(int(counts[code]) != h["ops_by_kind"][name] for code, name in OP_NAMES.items()):
        raise TraceError("ops_by_kind disagrees with the op array")
    rows = op != CAN_ALLOCATE
    if np.any(rows) and (a0[rows].min() < 0 or a0[rows].max() >= cfg["max_seqs"]):
        raise TraceError("row ids outside [0, max_seqs)")
    forks, allocs, asks, seals = op == FORK, (op == ALLOCATE) | (op == ALLOCATE_CACHED), op == CAN_ALLOCATE, op == SEAL
    if np.any(forks) and (a1[forks].min() < 0 or a1[forks].max() >= cfg["max_seqs"]):
        raise TraceError("fork targets outside [0, max_seqs)")
    if np.any(allocs) and (a1[allocs].min() < 1 or a1[allocs].max() > cfg["max_blocks_per_seq"] * cfg["block_size"]):
        raise TraceError("allocations outside [1, max_blocks_per_seq * block_size] tokens")
    if np.any(asks) and (a0[asks].min() < 0 or a1[asks].min() < 0 or a1[asks].max() > 1):
        raise TraceError("can_allocate ops with a negative count or an answer other than 0/1")
    if np.any(seals) and (a1[seals].min() < 0 or a1[seals].max() > 1):
        raise TraceError("seal ops with an answer other than 0/1")
    edges = np.zeros(len(op) + 1, dtype=np.int64)  # +1 where a decode part starts, -1 where it ends
    np.add.at(edges, a["decode_offsets"], 1)
    np.add.at(edges, a["step_offsets"][1:], -1)
    if np.any((op == APPEND) != (np.cumsum(edges)[:-1] > 0)):
        raise TraceError("appends must be exactly the decode part of each step")


def _validate_cache(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    """Hash indices, chain lengths and the cache totals (format 3)."""
    c, bs, op, a1, where = h["cache"], h["config"]["block_size"], a["op"], a["a1"], a["op_hash"]
    if len(a["hashes"]) != c["hashes"] or len(where) != h["num_ops"]:
        raise TraceError("hashes or op_hash disagree with the header's counts")
    if len(a["step_hits"]) != h["num_steps"] or len(a["step_evictions"]) != h["num_steps"]:
        raise TraceError("step_hits or step_evictions disagree with num_steps")
    cached, sealed = op == ALLOCATE_CACHED, op == SEAL
    if h["prefix_caching"] != bool(np.any(cached | sealed)):
        raise TraceError("header field 'prefix_caching' disagrees with the op array (prefix-caching ops or none)")
    if np.any(where[~(cached | sealed)] != -1):
        raise TraceError("op_hash must be -1 for every op but allocate_cached and seal")
    lengths = np.where(cached, a1.astype(np.int64) // bs, sealed.astype(np.int64))
    has = cached | sealed
    if np.any(has) and (where[has].min() < 0 or np.any(where[has] + lengths[has] > len(a["hashes"]))):
        raise TraceError("op_hash points outside the hashes array")
    if np.any(a["hashes"] == 0):
        raise TraceError("a block hash of 0 (hashes are in [1, 2**64))")
    totals = {"lookup_tokens": int(a1[cached].sum()), "lookup_blocks": int(lengths[cached].sum()),
              "hit_tokens": int(a["step_hits"].sum()), "evictions": int(a["step_evictions"].sum()),
              "seals": int(sealed.sum()), "seals_cached": int(a1[sealed].sum())}
    if np.any(a["step_hits"] < 0) or np.any(a["step_evictions"] < 0) or np.any(a["step_hits"] % bs):
        raise TraceError("step_hits must be whole blocks of tokens and step_evictions >= 0")
    if any(c[k] != v for k, v in totals.items()):
        raise TraceError(f"header field 'cache' disagrees with the arrays ({totals})")
    _validate_chains(a, np.flatnonzero(cached), lengths)


def _validate_chains(a: Mapping[str, np.ndarray], ops: np.ndarray, lengths: np.ndarray) -> None:
    """No hash twice within one prompt chain (a row holds a block once)."""
    hashes, where = a["hashes"], a["op_hash"]
    for i in ops.tolist():
        n = int(lengths[i])
        if n > 1 and len(np.unique(hashes[where[i] : where[i] + n])) != n:
            raise TraceError(f"op {i}: a hash twice in one prompt chain")


def _validate_end_state(h: Mapping, a: Mapping[str, np.ndarray]) -> None:
    cfg, lens, canon = h["config"], a["final_lens"], a["final_canon"]
    if len(lens) != cfg["max_seqs"]:
        raise TraceError("final_lens must have one entry per row")
    if np.any(lens < 0) or np.any(lens > cfg["max_blocks_per_seq"] * cfg["block_size"]):
        raise TraceError("final_lens outside [0, max_blocks_per_seq * block_size]")
    if int(np.count_nonzero(lens)) != h["live_at_end"]:
        raise TraceError("final_lens disagree with live_at_end")
    if len(canon) != int(blocks_for(lens.astype(np.int64), cfg["block_size"]).sum()):
        raise TraceError("final_canon does not hold the block tables of final_lens")
    in_use = int(canon.max()) + 1 if len(canon) else 0
    if (len(canon) and canon.min() < 0) or cfg["num_blocks"] - in_use != h["final_free"]:
        raise TraceError("final_canon disagrees with final_free")
