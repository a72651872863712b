"""Hostile trace files: zip bombs, byte flips, edited headers with a recomputed checksum.

Each must be refused by ``load`` with a :class:`TraceError` (one line, naming the file and what is wrong),
before anything is decompressed where sizes are at stake; never a traceback of another type.
"""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from scenarios import TraceError, generate, load, save
from scenarios.trace.file_format import MAX_TRACE_BYTES, checksum
from scenarios.trace.storage import check_writable
from tests.one_line import one_line


@pytest.fixture(scope="module")
def trace():
    return generate("paper", steps=3, running=4, num_blocks=64, max_blocks_per_seq=16)


@pytest.fixture(scope="module")
def blob(trace, tmp_path_factory) -> bytes:
    return save(trace, tmp_path_factory.mktemp("t") / "t.npz").read_bytes()


def _npz(path, header, arrays, compress=True) -> None:
    head = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    (np.savez_compressed if compress else np.savez)(path, header=head, **arrays)


def _edited(trace, **changes) -> dict:
    """The trace's header with ``changes`` (dotted keys reach into config) and a recomputed checksum."""
    header = json.loads(json.dumps(trace.header))
    for key, value in changes.items():
        where, key = (header["config"], key[7:]) if key.startswith("config.") else (header, key)
        if value is KeyError:
            del where[key]
        else:
            where[key] = value
    if isinstance(header, dict) and isinstance(header.get("checksum"), str):
        header["checksum"] = checksum(header, trace.arrays)
    return header


def _refused(path, *needles: str) -> str:
    with pytest.raises(TraceError) as info:
        load(path)
    return one_line(info.value, path, *needles)


# -- edited headers, checksum recomputed: schema and consistency checks, not the checksum, refuse them --------
@pytest.mark.parametrize(
    "changes, needles",
    [
        ({"config.num_blocks": 0}, ["num_blocks must be a positive integer"]),
        ({"config.block_size": 3}, ["block_size must be a power of two"]),
        ({"config.max_seqs": "4"}, ["max_seqs must be a positive integer"]),
        ({"config.extra": 1}, ["'config'", "exactly"]),
        ({"config": "num_blocks=64"}, ["'config'", "JSON object"]),
        ({"max_blocks_per_seq": 1}, ["unknown fields"]),
        ({"num_steps": "3"}, ["'num_steps'", "integer >= 0"]),
        ({"num_steps": True}, ["'num_steps'"]),
        ({"num_steps": 0}, ["'num_steps'", "at least 1"]),
        ({"num_steps": 4}, ["step_offsets", "holds 4 values"]),
        ({"num_ops": 10**15}, ["'num_ops'", "more than"]),
        ({"seed": -1}, ["'seed'"]),
        ({"scenario": 7}, ["'scenario'", "string"]),
        ({"ops_by_kind": {"append": 1}}, ["'ops_by_kind'"]),
        ({"peak_blocks_in_use": 65}, ["'peak_blocks_in_use'"]),
        ({"final_free": 3}, ["final_free"]),
        ({"cow_count": 99}, ["cow_count"]),
        ({"live_at_end": 0}, ["live_at_end"]),
        ({"config.max_seqs": KeyError}, ["'config'", "exactly"]),
        ({"params": KeyError}, ["lacks ['params']"]),
    ],
    ids=lambda v: json.dumps(v, default=str)[:40],
)
def test_edited_header_with_recomputed_checksum(tmp_path, trace, changes, needles) -> None:
    header = _edited(trace, **changes)
    _npz(tmp_path / "t.npz", header, trace.arrays)
    _refused(tmp_path / "t.npz", *needles)


@pytest.mark.parametrize("header", [[1, 2], "a string", 3, None])
def test_header_not_an_object(tmp_path, trace, header) -> None:
    _npz(tmp_path / "t.npz", header, trace.arrays)
    _refused(tmp_path / "t.npz", "not a kvblock-bench trace")


def test_edited_array_with_recomputed_checksum(tmp_path, trace) -> None:
    a1 = trace.a1.copy()
    a1[trace.op == 1] = 10**6  # allocations larger than a sequence
    arrays = {**trace.arrays, "a1": a1}
    header = dict(trace.header, checksum=checksum(trace.header, arrays))
    _npz(tmp_path / "t.npz", header, arrays)
    _refused(tmp_path / "t.npz", "allocations outside")


def test_wrong_dtype_and_shape(tmp_path, trace) -> None:
    _npz(tmp_path / "a.npz", trace.header, {**trace.arrays, "a0": trace.a0.astype(np.int64)})
    _refused(tmp_path / "a.npz", "'a0'", "dtype int64")
    _npz(tmp_path / "b.npz", trace.header, {**trace.arrays, "a0": trace.a0.reshape(1, -1)})
    _refused(tmp_path / "b.npz", "'a0'", "shape")
    _npz(tmp_path / "c.npz", trace.header, {**trace.arrays, "extra": np.zeros(3)})
    _refused(tmp_path / "c.npz", "unexpected", "extra.npy")


def _zip_bomb(path, trace, name: str, n: int, header=None) -> None:
    """A trace whose array ``name`` is ``n`` zeros, written without ever holding them in memory."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, arr in {"header": np.frombuffer(json.dumps(header or trace.header).encode(), np.uint8),
                         **trace.arrays}.items():
            if key != name:
                buf = io.BytesIO()
                np.save(buf, arr)
                zf.writestr(f"{key}.npy", buf.getvalue())
                continue
            with zf.open(f"{key}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(arr.dtype),
                                                          "fortran_order": False, "shape": (n,)})
                chunk = bytes(1 << 20)
                left = n * arr.dtype.itemsize
                while left:
                    fh.write(chunk[: min(left, len(chunk))])
                    left -= min(left, len(chunk))


def test_zip_bomb_is_refused_before_decompression(tmp_path, trace) -> None:
    import resource

    path = tmp_path / "bomb.npz"
    _zip_bomb(path, trace, "a0", 50_000_000)  # 200 MB of zeros in 200 KB
    assert path.stat().st_size < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _refused(path, "'a0'", "holds 50000000 values")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: nothing expanded


def test_zip_bomb_with_a_matching_header_is_refused(tmp_path, trace) -> None:
    n = MAX_TRACE_BYTES // 4
    header = _edited(trace, num_ops=n, ops_by_kind={**trace.header["ops_by_kind"], "append": n})
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w") as zf:  # only the header: it is refused before any array is looked at
        zf.writestr("header.npy", _npy(np.frombuffer(json.dumps(header).encode(), np.uint8)))
    _refused(path, "'num_ops'", "more than")


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_huge_header_is_refused(tmp_path, trace) -> None:
    path = tmp_path / "h.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("header.npy", _npy(np.zeros(50 << 20, np.uint8)))
    _refused(path, "header of")


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04" + bytes(40)])
def test_not_a_zip(tmp_path, content) -> None:
    (tmp_path / "t.npz").write_bytes(content)
    _refused(tmp_path / "t.npz", "not a readable trace file")


def test_folder_and_unreadable(tmp_path) -> None:
    _refused(tmp_path, "is a folder")


# -- byte flips: every flip is refused cleanly or (a flip in a field nobody reads) loads the same trace ------
FUZZ_POSITIONS = 600


def test_byte_flips_are_refused_or_harmless(tmp_path, trace, blob) -> None:
    rng = np.random.default_rng(0)
    positions = np.unique(np.concatenate([np.arange(min(len(blob), 200)), np.arange(max(0, len(blob) - 200),
                                                                                    len(blob)),
                                          rng.integers(0, len(blob), FUZZ_POSITIONS - 400)]))
    path = tmp_path / "f.npz"
    refused = identical = 0
    for pos in positions:
        damaged = bytearray(blob)
        damaged[pos] ^= 1 << int(rng.integers(0, 8)) if pos % 2 else 0xFF
        path.write_bytes(bytes(damaged))
        try:
            back = load(path)
        except TraceError as exc:
            one_line(exc, path)
            refused += 1
            continue
        assert back.header == trace.header, f"flip at {pos} changed the header and loaded"
        assert all(np.array_equal(back.arrays[k], v) for k, v in trace.arrays.items()), f"flip at {pos}"
        identical += 1
    print(f"byte flips: {len(positions)} positions of {len(blob)} bytes, {refused} refused, {identical} identical")
    assert refused + identical == len(positions) and refused > len(positions) // 2


# -- output paths: refused before the simulation, not after ----------------------------------------------
def test_check_writable(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    for bad, needle in [(tmp_path, "is a folder"), (tmp_path / "file" / "t.npz", "not a folder"),
                        (tmp_path / "file" / "sub" / "t.npz", "not a folder")]:
        with pytest.raises(TraceError, match=needle) as info:
            check_writable(bad)
        one_line(info.value, bad)
    assert check_writable(tmp_path / "new" / "t.npz") == tmp_path / "new" / "t.npz"
    assert list((tmp_path).iterdir()) == [tmp_path / "file"]  # the probe leaves nothing behind


def test_save_into_a_file_path_is_a_trace_error(tmp_path, trace) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(TraceError, match="not a folder"):
        save(trace, tmp_path / "file" / "t.npz")


# -- scenario parameters: one-line errors naming the flag, the valid range and the fix; nothing capped ------
@pytest.mark.parametrize(
    "argv, needles",
    [
        (["paper", "--block-size", "3"], ["--block-size 3", "power of two", "e.g. --block-size 16"]),
        (["paper", "--seed", "-1"], ["--seed -1", "[0, 9223372036854775807]", "e.g. --seed 0"]),
        (["paper", "--sigma", "nan"], ["--sigma nan", "[0, 10]", "e.g. --sigma 1.0"]),
        (["paper", "--running", "100000"], ["--running 100000", "65536 blocks", "raise --num-blocks"]),
        (["paper", "--steps", "1e400"], ["'steps'", "e.g. --steps 2000"]),
        (["paper", "--num-blocks", "99999999999"], ["--num-blocks", "[1, 16777216]"]),
        (["beam-search", "--beam-width", "9", "--running", "4"], ["--beam-width 9", "running=4"]),
        (["azure-code", "--concurrency", "-5"], ["--concurrency -5", "positive", "e.g. --concurrency 256"]),
        (["azure-code", "--duration-s", "inf"], ["--duration-s inf"]),
        (["azure-code", "--max-steps", "0"], ["--max-steps 0"]),
    ],
)
def test_bad_scenario_parameters(tmp_path, capsys, argv, needles) -> None:
    from harness.cli import main

    assert main(["trace", *argv, "-o", str(tmp_path / "t.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvblock-bench: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    assert not (tmp_path / "t.npz").exists()
