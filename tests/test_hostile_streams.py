"""Files that are not regular files, read (issue 27, item 4): a FIFO is read once as a stream or refused in one
line, a device node is refused, nothing waits for ever; a cached trace is checked against its content.

FIFOs and device nodes are made in a temporary folder. A FIFO "with a writer" is fed by a thread of the test
that opened it first (holding a reader of its own, so that its open returns at once: no race with the reader
under test); one "without a writer" has nobody at the other end, which is where the old reader hung.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from harness.base.files import ResultsError, read_json
from harness.base.rows import Row, read_rows, write_rows
from harness.cli import main
from harness.run.trace_cache import cached_trace
from scenarios import generate, load, read_requests_csv, save
from scenarios.realtrace import DATA_DIR
from tests.test_hostile_files import one_line_error

AZURE = DATA_DIR / "azure_code_2023.csv"  # 423 KB: many times a pipe's buffer


pytestmark = pytest.mark.usefixtures("no_hang")


@contextmanager
def feeding(fifo: Path, data: bytes) -> Iterator[None]:
    """Within the block, a thread writes ``data`` into ``fifo`` and closes it (EOF for the reader)."""
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that the writer's open does not wait and
    writer = os.open(fifo, os.O_WRONLY)  # the pipe's buffer outlives the writer until the reader under test comes

    def write() -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(writer, view):]
        os.close(writer)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.set_blocking(keep, True)
        while os.read(keep, 1 << 20):  # whatever the reader under test left, so that the writer ends
            pass
        os.close(keep)
        thread.join(5)


def fifo(tmp_path: Path, name: str = "fifo") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def device(tmp_path: Path) -> Path:
    path = tmp_path / "device"
    try:
        os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # the numbers of /dev/zero: an endless stream
    except PermissionError:
        pytest.skip("mknod needs root")
    return path


# -- request CSVs ----------------------------------------------------------------------------------------------
def trace_from(csv: str, out: Path) -> int:
    return main(["trace", "--from-csv", csv, "--duration-s", "20", "-o", str(out)])


def test_csv_from_a_fifo_is_read_once(tmp_path: Path) -> None:
    path = fifo(tmp_path)
    with feeding(path, AZURE.read_bytes()):
        assert trace_from(str(path), tmp_path / "t.npz") == 0
    assert trace_from(str(AZURE), tmp_path / "d.npz") == 0
    assert load(tmp_path / "t.npz").arrays["a0"].tolist() == load(tmp_path / "d.npz").arrays["a0"].tolist()


def test_csv_from_an_anonymous_pipe(tmp_path: Path) -> None:
    """``--from-csv <(zcat requests.csv.gz)``: the shell passes /dev/fd/N, a pipe (not resolved to its link's
    target, ``pipe:[N]``, which is no file)."""
    read_end, write_end = os.pipe()

    def write() -> None:
        with os.fdopen(write_end, "wb") as fh:  # closed at the end: EOF for the reader
            fh.write(AZURE.read_bytes())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert trace_from(f"/dev/fd/{read_end}", tmp_path / "t.npz") == 0
    finally:
        os.close(read_end)
        writer.join(5)
    assert load(tmp_path / "t.npz").num_steps > 0


def test_csv_fifo_without_a_writer_is_refused_at_once(tmp_path: Path, capsys) -> None:
    path = fifo(tmp_path)
    t0 = time.perf_counter()
    one_line_error(capsys, trace_from(str(path), tmp_path / "t.npz"), str(path), "no writer")
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "t.npz").exists()


def test_csv_that_is_a_device_is_refused(tmp_path: Path, capsys) -> None:
    path = device(tmp_path)
    one_line_error(capsys, trace_from(str(path), tmp_path / "t.npz"), str(path), "character device")


def test_prefix_caching_csv_from_a_fifo_reads_its_hash_ids_from_the_same_stream(tmp_path: Path) -> None:
    """With prefix caching the file is read three times over (header, values, hash ids): all from one stream."""
    head = b"".join((DATA_DIR / "mooncake_conversation_2025.csv").open("rb").readlines()[:300])
    (tmp_path / "m.csv").write_bytes(head)
    path = fifo(tmp_path)
    with feeding(path, head):
        streamed = read_requests_csv(path, hash_tokens=512)
    pd.testing.assert_frame_equal(streamed, read_requests_csv(tmp_path / "m.csv", hash_tokens=512))


def test_endless_fifo_is_refused_not_spooled_for_ever(tmp_path: Path, monkeypatch) -> None:
    from scenarios.files import kinds
    from scenarios.scheduler import ScenarioError

    monkeypatch.setattr(kinds, "MAX_STREAM_BYTES", 1 << 20)
    path = fifo(tmp_path)
    with feeding(path, b"timestamp,prompt_tokens,output_tokens\n" + b"0,1,1\n" * 400_000), \
            pytest.raises(ScenarioError, match="more than 1 MiB"):
        read_requests_csv(path)


# -- trace files, results files --------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [fifo, device])
def test_trace_file_that_is_not_a_regular_file_is_refused(tmp_path: Path, capsys, make) -> None:
    path = make(tmp_path)
    what = "FIFO" if make is fifo else "character device"
    one_line_error(capsys, main(["trace", "--show", str(path)]), str(path), what)
    code = main(["run", "--results", str(tmp_path / "r"), "--trace", str(path), "--no-progress"])
    one_line_error(capsys, code, str(path), what)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_results_and_meta_from_fifos(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    write_rows(good, [Row("paper", "flat", "batched", "seq_step_ns", 10.0, "ns", "rdtsc")])
    path = fifo(tmp_path, "results.csv")
    with pytest.raises(ResultsError, match="no writer"):
        read_rows(path)
    with feeding(path, good.read_bytes()):
        assert read_rows(path) == read_rows(good)  # read once, as a stream
    meta = fifo(tmp_path, "meta.json")
    with pytest.raises(ResultsError, match=r"meta\.json.*no writer"):
        read_json(meta)
    with feeding(meta, json.dumps({"complete": True}).encode()):
        assert read_json(meta) == {"complete": True}


# -- the trace cache: checked against its content, not trusted by name -------------------------------------------
def entry(cache: Path) -> tuple[Path, Path]:
    (npz,) = cache.glob("long-context-*.npz")
    return npz, npz.with_suffix(".json")


def test_cached_trace_is_reused_when_its_content_checks_out(tmp_path: Path) -> None:
    first, _ = cached_trace("long-context", {"steps": 20}, tmp_path)
    npz, claim = entry(tmp_path)
    stamp = npz.stat().st_mtime_ns
    again, _ = cached_trace("long-context", {"steps": 20}, tmp_path)
    assert again.header == first.header and npz.stat().st_mtime_ns == stamp  # read, not regenerated
    assert read_json(claim)["checksum"] == first.header["checksum"]


def test_another_trace_under_the_name_is_not_trusted(tmp_path: Path) -> None:
    cached_trace("long-context", {"steps": 20}, tmp_path)
    npz, claim = entry(tmp_path)
    save(generate("long-context", steps=30), npz)  # a valid trace, with its own checksum, of other parameters
    trace, _ = cached_trace("long-context", {"steps": 20}, tmp_path)
    assert trace.num_steps == 20 and load(npz).num_steps == 20  # regenerated and rewritten
    shutil.copy(npz, tmp_path / "keep.npz")
    claim.write_text(json.dumps({**read_json(claim), "params": {"steps": 30}}))  # a claim edited to match nothing
    trace, _ = cached_trace("long-context", {"steps": 20}, tmp_path)
    assert trace.num_steps == 20 and read_json(claim)["params"]["steps"] == 20


def test_damaged_or_missing_claim_is_regenerated(tmp_path: Path) -> None:
    cached_trace("long-context", {"steps": 20}, tmp_path)
    npz, claim = entry(tmp_path)
    npz.write_bytes(npz.read_bytes()[:-100])
    assert cached_trace("long-context", {"steps": 20}, tmp_path)[0].num_steps == 20
    claim.unlink()
    assert cached_trace("long-context", {"steps": 20}, tmp_path)[0].num_steps == 20 and claim.is_file()
    claim.write_text("[" * 100_000)
    assert cached_trace("long-context", {"steps": 20}, tmp_path)[0].num_steps == 20


def test_cache_entry_that_is_a_fifo_or_a_link_is_left_alone(tmp_path: Path, capsys) -> None:
    cached_trace("long-context", {"steps": 20}, tmp_path)
    npz, _ = entry(tmp_path)
    npz.unlink()
    os.mkfifo(npz)
    trace, _ = cached_trace("long-context", {"steps": 20}, tmp_path)  # not read (it would wait), not replaced
    assert trace.num_steps == 20 and stat.S_ISFIFO(os.lstat(npz).st_mode)
    assert "not written" in capsys.readouterr().err
    npz.unlink()
    outside = tmp_path / "outside.npz"
    outside.write_bytes(b"mine")
    npz.symlink_to(outside)
    assert cached_trace("long-context", {"steps": 20}, tmp_path)[0].num_steps == 20
    assert npz.is_symlink() and outside.read_bytes() == b"mine"


def test_cache_that_cannot_be_written_costs_only_the_caching(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    trace, _ = cached_trace("long-context", {"steps": 20}, blocker)
    assert trace.num_steps == 20
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "trace cache is not written" in line and blocker.read_text().startswith("a file")
