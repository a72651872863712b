"""Trace files: damaged, edited or foreign files fail with a clear message before any replay."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from scenarios import ScenarioError, TraceError, generate, load, read_requests_csv, save
from scenarios.trace.file_format import FORMAT_VERSION


@pytest.fixture(scope="module")
def trace():
    return generate("parallel-sampling", steps=10)


def test_round_trip(tmp_path, trace) -> None:
    back = load(save(trace, tmp_path / "t.npz"))
    assert back.header == trace.header
    for name, arr in trace.arrays.items():
        assert np.array_equal(back.arrays[name], arr)


def test_save_is_atomic_and_leaves_no_temporaries(tmp_path, trace) -> None:
    save(trace, tmp_path / "t.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]


def test_truncated_file(tmp_path, trace) -> None:
    path = save(trace, tmp_path / "t.npz")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(TraceError, match="truncated or corrupted"):
        load(path)


def test_corrupted_bytes(tmp_path, trace) -> None:
    path = save(trace, tmp_path / "t.npz")
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError):
        load(path)


def _rewrite(path, trace, header=None, **arrays) -> None:
    payload = {**trace.arrays, **arrays}
    head = json.dumps(header if header is not None else trace.header).encode()
    np.savez(path, header=np.frombuffer(head, dtype=np.uint8), **payload)


def test_hand_edited_array(tmp_path, trace) -> None:
    a0 = trace.a0.copy()
    a0[5] += 1
    _rewrite(tmp_path / "t.npz", trace, a0=a0)
    with pytest.raises(TraceError, match="checksum"):
        load(tmp_path / "t.npz")


def test_hand_edited_header(tmp_path, trace) -> None:
    _rewrite(tmp_path / "t.npz", trace, header={**trace.header, "final_free": 1})
    with pytest.raises(TraceError, match="checksum"):
        load(tmp_path / "t.npz")


def test_wrong_version(tmp_path, trace) -> None:
    _rewrite(tmp_path / "t.npz", trace, header={**trace.header, "version": FORMAT_VERSION + 1})
    with pytest.raises(TraceError, match="version"):
        load(tmp_path / "t.npz")


def test_not_a_trace(tmp_path) -> None:
    np.savez(tmp_path / "x.npz", data=np.arange(3))
    with pytest.raises(TraceError, match="no header"):
        load(tmp_path / "x.npz")
    with zipfile.ZipFile(tmp_path / "y.npz", "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(TraceError):
        load(tmp_path / "y.npz")
    with pytest.raises(TraceError, match="no such"):
        load(tmp_path / "missing.npz")


@pytest.mark.parametrize(
    "content, match",
    [
        ("timestamp,prompt_tokens\n0,5\n", "missing column"),
        ("timestamp,prompt_tokens,output_tokens\n0,5,3\n1,abc,3\n", r"line 3, column 'prompt_tokens'"),
        ("timestamp,prompt_tokens,output_tokens\n0,5,3\n1,5,0\n", r"line 3, column 'output_tokens'"),
        ("timestamp,prompt_tokens,output_tokens\n-1,5,3\n", r"line 2, column 'timestamp'"),
        ("timestamp,prompt_tokens,output_tokens\n0,5.5,3\n", "integer"),
        ("timestamp,prompt_tokens,output_tokens\n", "no requests"),
    ],
)
def test_malformed_csv_names_line_and_column(tmp_path, content: str, match: str) -> None:
    path = tmp_path / "r.csv"
    path.write_text(content)
    with pytest.raises(ScenarioError, match=match):
        read_requests_csv(path)


def test_extra_columns_are_ignored(tmp_path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("id,timestamp,prompt_tokens,output_tokens,note\n7,0.5,40,3,x\n8,0.1,20,2,y\n")
    df = read_requests_csv(path)
    assert df.prompt_tokens.tolist() == [20, 40]  # sorted by arrival
