"""Files we write and the results we read back, under hostile paths and failing disks (issue 27, items 3 and 5).

Each case holds: what was saved before is kept, one line says why, the exit status is non-zero where anything
failed, no traceback, nothing replaced that should not be. Device nodes and FIFOs are made in a temporary folder
(never /dev's). A full disk is a 2 MiB tmpfs where this machine lets the tests mount one, and everywhere an
injected ENOSPC inside the one atomic-write implementation; a read-only folder is a read-only bind mount, or an
injected EROFS.
"""

from __future__ import annotations

import csv
import errno
import fnmatch
import gzip
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.base.files import ResultsError, check_run_root, point_latest, read_json
from harness.base.rows import COLUMNS, MAX_TEXT_CHARS, Row, read_rows, write_rows
from harness.cli import main
from harness.errors import WriteError
from scenarios import generate, load, save
from scenarios.files import atomic
from scenarios.files.kinds import NotRegularFileError
from scenarios.trace import storage as trace_files
from tests.test_hostile_cli import ROOT, run_past_its_first_scenario

pytestmark = pytest.mark.usefixtures("no_hang")
QUICK = ["--quick", "--impl", "dict", "--no-progress", "--no-l1d", "--no-paced", "--no-table-copy"]


def one_line_error(capsys, code: int, *words: str) -> str:
    """The in-process command ended with ``code`` (non-zero) and exactly one stderr line naming ``words``."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith("kvblock-bench: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def special_files(folder: Path) -> dict[str, Path]:
    """A character device (the numbers of /dev/null), a FIFO and a socket, made in ``folder``."""
    made = {"fifo": folder / "fifo"}
    os.mkfifo(made["fifo"])
    try:
        os.mknod(folder / "device", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
        made["device"] = folder / "device"
    except PermissionError:  # not root: the FIFO and the socket still show the rule
        pass
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "socket"))
    sock.close()
    made["socket"] = folder / "socket"
    return made


def kind(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


def _mount(*args: str) -> bool:
    return os.geteuid() == 0 and subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs: a disk that really fills up (skipped where tests cannot mount one)."""
    where = tmp_path / "disk"
    where.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)):
        pytest.skip("cannot mount a tmpfs here; test_disk_full_mid_run (injected ENOSPC) covers the same path")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


@pytest.fixture
def read_only_view(tmp_path: Path):
    """``make(folder)``: a read-only bind mount of ``folder`` (skipped where tests cannot mount)."""
    mounts: list[Path] = []

    def make(folder: Path) -> Path:
        view = tmp_path / f"ro{len(mounts)}"
        view.mkdir()
        if not (_mount("--bind", str(folder), str(view)) and _mount("-o", "remount,bind,ro", str(view))):
            subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)
            pytest.skip("cannot make a read-only bind mount here; the injected EROFS tests cover the same path")
        mounts.append(view)
        return view

    yield make
    for view in mounts:
        subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)


def inject(monkeypatch, error: int, name: str, after: int = 0) -> None:
    """Writes of files whose name matches ``name`` (a glob) fail with ``error`` inside the one atomic-write
    implementation (half written, as a full disk would leave them), after ``after`` successful ones."""
    real, seen = atomic.atomic_write, [0]

    def failing(path, write):
        if not fnmatch.fnmatch(Path(path).name, name):
            return real(path, write)
        seen[0] += 1
        if seen[0] <= after:
            return real(path, write)

        def half(fh):
            fh.write(b"half a file")
            raise OSError(error, os.strerror(error))

        return real(path, half)

    monkeypatch.setattr(atomic, "atomic_write", failing)
    monkeypatch.setattr(trace_files, "atomic_write", failing)  # trace files call it by its own name


def tiny_trace(path: Path) -> Path:
    return save(generate("long-context", steps=20), path)


# -- atomic writes: only regular files are replaced; links are followed -----------------------------------
def test_atomic_write_never_replaces_a_device_fifo_socket_or_folder(tmp_path: Path) -> None:
    for name, path in [*special_files(tmp_path).items(), ("folder", tmp_path)]:
        before = kind(path)
        with pytest.raises(OSError) as err:
            atomic.atomic_write_bytes(path, b"data")
        assert kind(path) == before, name  # still what it was
        assert name in str(err.value) or "folder" in str(err.value), err.value
    assert not list(tmp_path.glob(".*.tmp"))


def test_atomic_write_follows_a_link_and_refuses_loops(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "target.txt"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link"
    link.symlink_to(target)
    atomic.atomic_write_bytes(link, b"new")
    assert link.is_symlink() and target.read_text() == "new"  # the link stays, its target is rewritten
    dangling = tmp_path / "dangling"
    dangling.symlink_to("made.txt")
    atomic.atomic_write_bytes(dangling, b"x")
    assert dangling.is_symlink() and (tmp_path / "made.txt").read_bytes() == b"x"
    (tmp_path / "to-fifo").symlink_to(special_files(tmp_path)["fifo"])
    with pytest.raises(NotRegularFileError, match="FIFO"):
        atomic.atomic_write_bytes(tmp_path / "to-fifo", b"x")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match="loop"):
        atomic.atomic_write_bytes(tmp_path / "a", b"x")
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()


def test_atomic_write_of_a_long_name_and_a_failed_write(tmp_path: Path, monkeypatch) -> None:
    long = tmp_path / ("n" * 250)  # valid, but a temporary named after it whole would not be
    atomic.atomic_write_bytes(long, b"old")
    inject(monkeypatch, errno.ENOSPC, long.name)
    with pytest.raises(OSError, match="No space left"):
        atomic.atomic_write_bytes(long, b"new")
    assert long.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == [long.name]


def test_trace_output_that_is_not_a_regular_file(tmp_path: Path, capsys) -> None:
    for what, path in special_files(tmp_path).items():
        before = kind(path)
        t0 = time.perf_counter()
        one_line_error(capsys, main(["trace", "paper", "-o", str(path)]), str(path), "not a regular file")
        assert time.perf_counter() - t0 < 5, what  # refused before the simulation
        assert kind(path) == before, what
        link = tmp_path / f"link-to-{what}.npz"
        link.symlink_to(path)
        one_line_error(capsys, main(["trace", "paper", "-o", str(link)]), "not a regular file")
        assert kind(path) == before and link.is_symlink(), what


def test_trace_output_link_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "real.npz"
    target.write_bytes(b"old")
    link = tmp_path / "link.npz"
    link.symlink_to(target.name)
    tiny_trace(link)
    assert link.is_symlink() and load(target).num_steps == 20


def test_trace_write_that_fails_keeps_the_old_file(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tiny_trace(tmp_path / "t.npz")
    inject(monkeypatch, errno.ENOSPC, "t.npz")
    code = main(["trace", "long-context", "--steps", "30", "-o", str(out)])
    one_line_error(capsys, code, "t.npz", "No space left on device")
    assert load(out).num_steps == 20 and [p.name for p in tmp_path.iterdir()] == ["t.npz"]


def fill(disk: Path) -> None:
    """Fill ``disk`` up with a file called ``fill``."""
    with open(disk / "fill", "wb") as fh, pytest.raises(OSError, match="No space left"):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()


def test_trace_on_a_full_disk(small_disk: Path, capsys) -> None:
    fill(small_disk)
    code = main(["trace", "long-context", "--steps", "20", "-o", str(small_disk / "t.npz")])
    one_line_error(capsys, code, "t.npz", "No space left on device")
    assert sorted(p.name for p in small_disk.iterdir()) == ["fill"]


# -- --readme ------------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_run(tmp_path: Path) -> Path:
    """A results folder with one small run (rows and meta.json), ``latest`` pointing to it."""
    run = tmp_path / "results" / "20200101-000000"
    run.mkdir(parents=True)
    write_rows(run / "results.csv", [Row("paper", "flat", "batched", "seq_step_ns", 10.0, "ns", "rdtsc")])
    (run / "meta.json").write_text(json.dumps({"complete": True, "command_line": "kvblock-bench run"}))
    (run.parent / "latest").symlink_to(run.name)
    return run.parent


def test_readme_link_is_followed_and_special_files_refused(tiny_run: Path, tmp_path: Path, capsys) -> None:
    readme = tmp_path / "docs" / "README.md"
    readme.parent.mkdir()
    readme.write_text("# x\n<!-- results:begin -->\nold\n<!-- results:end -->\n")
    link = tmp_path / "README-link.md"
    link.symlink_to(readme)
    assert main(["report", "--results", str(tiny_run), "--no-figures", "--readme", str(link)]) == 0
    assert link.is_symlink() and "old" not in readme.read_text() and "20200101-000000" in readme.read_text()
    capsys.readouterr()
    for what, path in special_files(tmp_path).items():
        before = kind(path)
        code = main(["report", "--results", str(tiny_run), "--no-figures", "--readme", str(path)])
        one_line_error(capsys, code, str(path), "not a regular file")
        assert kind(path) == before, what


# -- the run folder: everything checked before measuring ------------------------------------------------------
@pytest.mark.parametrize(("label", "words"), [
    ("x" * 300, ["--label", "300 characters", "64"]),
    ("a b/c", ["--label", "' /'"]),
    ("caf\udce9", ["--label"]),
])
def test_bad_label_is_refused_before_measuring(tiny_run: Path, capsys, label: str, words) -> None:
    before = sorted(p.name for p in tiny_run.iterdir())
    code = main(["run", "--results", str(tiny_run), *QUICK, "--scenario", "long-context", "--label", label])
    one_line_error(capsys, code, *words)
    assert sorted(p.name for p in tiny_run.iterdir()) == before


@pytest.mark.parametrize("what", ["folder", "file"])
def test_latest_that_is_not_a_link_is_refused_before_measuring(tmp_path: Path, capsys, what: str) -> None:
    latest = tmp_path / "latest"
    if what == "folder":
        latest.mkdir()
        (latest / "mine.txt").write_text("keep me")
    else:
        latest.write_text("keep me")
    code = main(["run", "--results", str(tmp_path), *QUICK, "--scenario", "long-context"])
    one_line_error(capsys, code, "latest", f"real {what}", "move it away")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no run folder, no .latest.PID
    assert (latest / "mine.txt" if what == "folder" else latest).read_text() == "keep me"


def test_point_latest_never_replaces_a_real_folder_and_leaves_no_temporary(tmp_path: Path) -> None:
    run = tmp_path / "20200101-000000"
    run.mkdir()
    (tmp_path / f".latest.{os.getpid()}.0").mkdir()  # a leftover in the way of the temporary link's name
    point_latest(run)
    assert os.readlink(tmp_path / "latest") == run.name
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").mkdir()
    with pytest.raises(WriteError, match="real folder"):
        point_latest(run)
    assert (tmp_path / "latest").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".latest.{os.getpid()}.0", run.name, "latest"]


def test_stale_latest_links_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".latest.{dead.pid}").symlink_to("gone")
    (tmp_path / f".latest.{os.getpid()}.0").symlink_to("mine")  # a live process's: kept
    check_run_root(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".latest.{os.getpid()}.0"]


@pytest.mark.parametrize(("error", "words"), [
    (errno.EROFS, ["Read-only file system"]),
    (errno.ENAMETOOLONG, ["File name too long", "shorter --label"]),
    (errno.ENOSPC, ["No space left on device"]),
])
def test_run_folder_that_cannot_be_made_is_found_before_measuring(tmp_path: Path, monkeypatch, capsys, error,
                                                                  words) -> None:
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name.endswith(".probe") or self.parent == tmp_path / "r":
            raise OSError(error, os.strerror(error), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    code = main(["run", "--results", str(tmp_path / "r"), *QUICK, "--scenario", "long-context"])
    one_line_error(capsys, code, str(tmp_path / "r"), *words)
    assert not (tmp_path / "r").exists()  # nothing made: a missing results folder is made when a run writes


def test_results_folder_whose_name_is_not_utf8(tmp_path: Path, capsys) -> None:
    results = Path(os.fsdecode(bytes(tmp_path) + b"/r\xe9"))
    code = main(["run", "--results", str(results), *QUICK, "--scenario", "long-context"])
    one_line_error(capsys, code, "--results", "not UTF-8")
    assert not results.exists()


def test_read_only_results_folder(tiny_run: Path, read_only_view, capsys) -> None:
    view = read_only_view(tiny_run)
    code = main(["run", "--results", str(view), *QUICK, "--scenario", "long-context"])
    one_line_error(capsys, code, "--results")  # the command line's own check: not writable
    from harness.run.runner import RunConfig, RunWriter

    with pytest.raises(WriteError, match="Read-only file system"):
        RunWriter(RunConfig(root=view), {})


# -- writes that fail mid-run ---------------------------------------------------------------------------------
@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_disk_full_mid_run_keeps_the_first_scenario(tiny_run: Path, monkeypatch, capsys) -> None:
    inject(monkeypatch, errno.ENOSPC, "results.csv", after=1)  # the first scenario's rows are written
    code = main(["run", "--results", str(tiny_run), *QUICK, "--scenario", "long-context,paper"])
    line = one_line_error(capsys, code, "results.csv", "No space left on device", "keeps the")
    run = tiny_run / os.readlink(tiny_run / "latest")
    assert run.name != "20200101-000000" and str(run) in line
    assert {r.scenario for r in read_rows(run / "results.csv")} == {"long-context"}
    assert not read_json(run / "meta.json")["complete"]
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert read_rows(tiny_run / "20200101-000000" / "results.csv")[0].value == 10.0


def test_disk_full_before_anything_was_saved_keeps_latest(tiny_run: Path, monkeypatch, capsys) -> None:
    inject(monkeypatch, errno.ENOSPC, "meta.json")
    code = main(["run", "--results", str(tiny_run), *QUICK, "--scenario", "long-context"])
    one_line_error(capsys, code, "meta.json", "No space left on device", "nothing of this run was saved")
    assert os.readlink(tiny_run / "latest") == "20200101-000000"


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_disk_really_full_mid_run(small_disk: Path) -> None:
    """A run on a 2 MiB tmpfs filled up once its first scenario is saved: one line, the first scenario kept."""
    results = small_disk / "r"
    proc = run_past_its_first_scenario(results, "--no-l1d", "--no-paced", "--no-table-copy")
    fill(small_disk)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert "No space left on device" in err.strip().splitlines()[-1]
    assert {r.scenario for r in read_rows(results / "latest" / "results.csv")} == {"long-context"}


def test_non_utf8_trace_name_is_measured_and_saved(tmp_path: Path, capsys) -> None:
    trace = tiny_trace(Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9.npz")))
    assert main(["run", "--results", str(tmp_path / "r"), *QUICK, "--trace", str(trace)]) == 0
    run = tmp_path / "r" / "latest"
    rows = read_rows(run / "results.csv")
    assert {r.scenario for r in rows} == {"trace:caf\ufffd.npz"}
    assert (run / "raw" / "trace:caf\ufffd.npz" / "dict__batched.json.gz").is_file()  # where readers look
    assert main(["report", "--results", str(tmp_path / "r"), "--no-figures"]) == 0


# -- results.csv always reads back ------------------------------------------------------------------------------
def test_text_fields_are_cleaned_and_bounded(tmp_path: Path) -> None:
    hostile = "RuntimeError: " + "".join(map(chr, range(32))) + "\x7f\u2028caf\udce9\r\n" + "x" * (200 << 10)
    row = Row("paper", "plug", "batched", "correctness", float("nan"), "", "trace check", "failed", hostile)
    assert len(row.how) <= MAX_TEXT_CHARS and row.how.isprintable() and "characters cut" in row.how
    assert "caf\ufffd" in row.how and row.how.startswith("RuntimeError: ")
    write_rows(tmp_path / "results.csv", [row])
    (back,) = read_rows(tmp_path / "results.csv")
    assert back.how == row.how and (tmp_path / "results.csv").read_text().count("\n") == 2


def test_reader_takes_a_huge_field_written_before_the_cut_and_names_an_absurd_one(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(COLUMNS)
        out.writerow(["paper", "plug", "batched", "correctness", "", "", "trace check", "failed",
                      "ValueError: " + "y" * (200 << 10) + "\nsecond line", "", "", "", "", "", "", "", ""])
    (row,) = read_rows(path)
    assert len(row.how) <= MAX_TEXT_CHARS and "\n" not in row.how
    with open(path, "a", newline="") as fh:
        csv.writer(fh).writerow(["paper", "x", "batched", "m", "", "", "s", "failed", "z" * (17 << 20)])
    with pytest.raises(ResultsError, match=r"results\.csv:4: .*field larger"):
        read_rows(path)


def test_report_reads_a_run_whose_failure_message_was_huge(tiny_run: Path, capsys) -> None:
    csv_path = tiny_run / "latest" / "results.csv"
    with open(csv_path, "a", newline="") as fh:
        csv.writer(fh).writerow(["paper", "plug", "batched", "correctness", "", "", "trace check", "failed",
                                 "E" * (300 << 10), "", "", "", "", "", "", "", ""])
    assert main(["report", "--results", str(tiny_run), "--no-figures"]) == 0
    assert "FAILED" in capsys.readouterr().out


def test_a_byte_order_mark_is_read(tiny_run: Path) -> None:
    csv_path = tiny_run / "latest" / "results.csv"
    csv_path.write_bytes(b"\xef\xbb\xbf" + csv_path.read_bytes())
    (row,) = read_rows(csv_path)
    assert row.scenario == "paper" and row.value == 10.0
    assert main(["report", "--results", str(tiny_run), "--no-figures"]) == 0


# -- report on a folder it cannot write -------------------------------------------------------------------------
def test_report_on_a_read_only_run_prints_the_tables(tiny_run: Path, read_only_view, capsys) -> None:
    view = read_only_view(tiny_run)
    code = main(["report", "--results", str(view)])
    printed = capsys.readouterr()
    (line,) = printed.err.strip().splitlines()
    assert code == 2 and "Read-only file system" in line and "printed above" in line
    assert main(["report", "--results", str(tiny_run), "--no-figures"]) == 0
    assert (tiny_run / "latest" / "paper_table.md").read_text() in printed.out  # the same tables, printed


@pytest.fixture
def reference_copy(tmp_path: Path) -> Path:
    """A results folder holding a copy of the committed reference run (a run with every figure)."""
    shutil.copytree(ROOT / "results" / "reference", tmp_path / "results" / "reference")
    (tmp_path / "results" / "latest").symlink_to("reference")
    return tmp_path / "results"


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
@pytest.mark.parametrize("name", ["paper_table.md", "*.png"])
def test_report_that_cannot_write_prints_the_tables(reference_copy: Path, monkeypatch, capsys, name: str) -> None:
    run = reference_copy / "reference"
    before = {p: p.read_bytes() for p in run.rglob(name)}
    inject(monkeypatch, errno.EROFS, name)
    code = main(["report", "--results", str(reference_copy)])
    line = one_line_error(capsys, code, "Read-only file system", "printed above")
    assert name.lstrip("*") in line
    assert {p: p.read_bytes() for p in run.rglob(name)} == before  # nothing half-written replaced them
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]


# -- meta.json, baseline: one line naming the file -------------------------------------------------------------
@pytest.mark.parametrize(("text", "words"), [
    ("{", ["meta.json", "not valid JSON"]),
    ("[" * 200_000 + "]" * 200_000, ["meta.json", "nested too deep"]),
    ("\xff", ["meta.json"]),
])
def test_meta_json_errors_name_the_file(tiny_run: Path, capsys, text: str, words) -> None:
    (tiny_run / "latest" / "meta.json").write_bytes(text.encode("latin-1"))
    code = main(["report", "--results", str(tiny_run), "--no-figures"])
    one_line_error(capsys, code, *words)


def test_meta_json_that_is_gzip_garbage(tmp_path: Path) -> None:
    (tmp_path / "x.json.gz").write_bytes(gzip.compress(b"{")[:-3])
    with pytest.raises(ResultsError, match=r"x\.json\.gz"):
        read_json(tmp_path / "x.json.gz")


@pytest.mark.parametrize(("content", "words"), [
    (b"{not json", ["meta.json", "not valid JSON"]),
    (b"[" * 200_000, ["meta.json", "nested too deep"]),
    (b"\xff\xfe", ["meta.json"]),
])
def test_baseline_of_a_run_with_a_bad_meta_json_is_one_line(tmp_path: Path, capsys, content: bytes, words) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.csv").write_text(",".join(COLUMNS) + "\n")
    (run / "meta.json").write_bytes(content)
    out = tmp_path / "base"
    code = main(["baseline", str(run), str(out)])
    one_line_error(capsys, code, *words)
    assert not out.exists()


def test_baseline_of_a_file_a_missing_run_or_into_a_special_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "run.json").write_text('{"benchmarks": []}')
    one_line_error(capsys, main(["baseline", str(tmp_path / "run.json"), str(tmp_path / "b")]), "run folder")
    one_line_error(capsys, main(["baseline", str(tmp_path / "none"), str(tmp_path / "b")]), "none")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.csv").write_text(",".join(COLUMNS) + "\n")
    (run / "meta.json").write_text('{"complete": true}')
    fifo = special_files(tmp_path)["fifo"]
    one_line_error(capsys, main(["baseline", str(run), str(fifo)]), str(fifo))
    assert kind(fifo) == stat.S_IFIFO
    assert main(["baseline", str(run), str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "results.csv").is_file()
