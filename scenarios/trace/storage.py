"""Trace files: a new trace stamped with the format's fields (:func:`finalize`), written atomically, and read with
every size checked before anything is decompressed."""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from impls.contract import ALLOCATE_CACHED, APPEND, OP_NAMES, SEAL

from ..files.atomic import atomic_write
from ..files.kinds import kind_of, unwritable
from . import ARRAYS, Trace, TraceError
from .checks import validate, validate_header
from .file_format import (
    CACHE_KEYS,
    FORMAT,
    FORMAT_VERSION,
    MAX_HEADER_BYTES,
    READABLE_VERSIONS,
    REGENERATE,
    V2_ARRAYS,
    V2_HEADER_KEYS,
    cache_totals,
    checksum,
)


def finalize(header: dict, arrays: Mapping[str, np.ndarray]) -> Trace:
    """Cast arrays, stamp format, version, the cache totals and checksum, and validate: the one way a Trace is
    made."""
    arrays = {name: np.ascontiguousarray(arrays[name], dtype=dtype) for name, dtype in ARRAYS.items()}
    header = {**header, "format": FORMAT, "version": FORMAT_VERSION,
              **cache_totals(arrays, header["config"]["block_size"])}
    header["checksum"] = checksum(header, arrays)
    trace = Trace(header, arrays)
    validate(trace)
    return trace


def check_writable(path: str | os.PathLike) -> Path:
    """Refuse an output path a trace cannot be written to; call it before the (long) simulation.

    The nearest existing folder above ``path`` must be a writable folder (``save`` creates the missing ones),
    and ``path`` itself must not be a folder, a device node, a FIFO or a socket (nothing but a regular file is
    ever replaced; a symbolic link is followed to its target, which is what is checked and written). Raises
    :class:`TraceError` naming the path and the fix.
    """
    path = Path(path)
    why = unwritable(path)
    if why == "is a folder":
        raise TraceError(f"{path}: is a folder; give a file name for the trace (-o {path / 'trace.npz'})")
    if why:
        raise TraceError(f"{path}: cannot write the trace: {why}; choose another output path")
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
    if header["checksum"] != checksum(header, arrays, V2_ARRAYS):
        raise TraceError("checksum mismatch: the file was modified or damaged after it was written")
    if len(arrays["op"]) and int(arrays["op"].max()) > APPEND:
        raise TraceError(f"format 2 trace with op code {int(arrays['op'].max())} (format 2 has codes 0 to {APPEND})")
    n_ops, n_steps = upgraded["num_ops"], upgraded["num_steps"]
    arrays.update(hashes=np.zeros(0, np.uint64), op_hash=np.full(n_ops, -1, np.int64),
                  step_hits=np.zeros(n_steps, np.int32), step_evictions=np.zeros(n_steps, np.int32))
    upgraded["checksum"] = checksum(upgraded, arrays)
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
