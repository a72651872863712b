"""Hostile request CSVs: every one fails with a ScenarioError naming the file, the line and the column or fix."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from scenarios import SCENARIOS, ScenarioError, read_requests_csv
from scenarios.realtrace import build_real_trace
from tests.one_line import one_line

HEAD = "timestamp,prompt_tokens,output_tokens\n"
ROOT = Path(__file__).resolve().parent.parent


def _refused(path, *needles: str, params: dict | None = None) -> str:
    with pytest.raises(ScenarioError) as info:
        if params is None:
            read_requests_csv(path)
        else:
            build_real_trace("csv:t", SCENARIOS["azure-code"].params({**params, "csv": str(path), "duration_s": None}))
    return one_line(info.value, path, *needles)


@pytest.mark.parametrize(
    "content, needles",
    [
        (HEAD + "0,1e20,3\n", ["line 2, column 'prompt_tokens'", "'1e20'", "[1, 2147483647]"]),
        (HEAD + "0,5,3\n1,5,9223372036854775808\n", ["line 3, column 'output_tokens'"]),
        (HEAD + "0,5,3\n1,4611686018427387904,4611686018427387904\n", ["line 3, column 'prompt_tokens'"]),
        (HEAD + "0,5,3\n1,5,nan\n", ["line 3, column 'output_tokens'"]),
        (HEAD + "inf,5,3\n", ["line 2, column 'timestamp'"]),
        (HEAD + "0,5,3\n\n\n0,-5,3\n", ["line 5, column 'prompt_tokens'"]),  # blank lines still count
        (HEAD + "0,5,3\n1,5\n", ["line 3: 2 fields", "header line has 3"]),
        (HEAD + "0,5,3\n1,5,3,4\n", ["line 3: 4 fields"]),
        (HEAD[:-1] + ',note\n0,5,3,"two\nlines"\n1,x,3,y\n', ["line 4, column 'prompt_tokens'"]),
        ("timestamp\tprompt_tokens\toutput_tokens\n0\t5\t3\n", ["line 1: missing column(s)", "tab-separated"]),
        ("timestamp;prompt_tokens;output_tokens\n0;5;3\n", ["semicolon-separated"]),
        ("", ["empty file"]),
        (HEAD, ["no requests"]),
        ("\ufeff" + HEAD + "0,5,3\n0,x,3\n", ["line 3, column 'prompt_tokens'"]),  # a BOM is fine
    ],
    ids=lambda v: repr(v)[:30],
)
def test_malformed_values(tmp_path, content, needles) -> None:
    path = tmp_path / "r.csv"
    path.write_text(content, encoding="utf-8")
    _refused(path, *needles)


def test_non_utf8_names_the_line(tmp_path) -> None:
    path = tmp_path / "r.csv"
    path.write_bytes((HEAD + "0,5,3\n1,5,3\n").encode() + b"2,5,3 \xff\xfe caf\xe9\n")
    _refused(path, "line 4", "0xff", "UTF-8")


def test_gzip_named_csv(tmp_path) -> None:
    path = tmp_path / "r.csv"
    path.write_bytes(gzip.compress((HEAD + "0,5,3\n").encode()))
    _refused(path, "gzip-compressed", "gunzip")


def test_binary_long_line(tmp_path) -> None:
    path = tmp_path / "r.csv"
    path.write_bytes(HEAD.encode() + b"1" * (3 << 20))
    _refused(path, "line 2 is longer than")


def test_folder_and_missing_paths(tmp_path) -> None:
    _refused(tmp_path, "is a folder")
    _refused(tmp_path / "none.csv", "no such CSV file")
    (tmp_path / "file").write_text("x")
    _refused(tmp_path / "file" / "r.csv", "cannot read")


@pytest.mark.parametrize(
    "rows, params, needles",
    [
        ("0,100,10\n1,5000,10\n", {"max_blocks_per_seq": 64}, ["line 3, column 'prompt_tokens'", "raise --max-blocks"]),
        ("0,100,10\n1,1000,100\n", {"max_blocks_per_seq": 64}, ["line 3, column 'output_tokens'", "= 1100 tokens"]),
        ("0,100,10\n1,2000000,10\n", {}, ["line 3, column 'prompt_tokens'", "the pool", "raise --num-blocks"]),
        ("0,100,10\n1,10,2000000\n", {}, ["line 3, column 'output_tokens'", "the pool"]),
        ("0,100,10\n1,2147483647,2147483647\n", {}, ["line 3, column 'prompt_tokens'"]),
    ],
)
def test_counts_beyond_a_sequence_name_line_and_column(tmp_path, rows, params, needles) -> None:
    path = tmp_path / "r.csv"
    path.write_text(HEAD + rows)
    _refused(path, *needles, params=params)


def test_too_many_steps_fails_before_simulating(tmp_path) -> None:
    path = tmp_path / "r.csv"
    path.write_text(HEAD + "".join(f"{i},100,1000\n" for i in range(200)))
    start = time.perf_counter()
    message = _refused(path, "more than max_steps=500", "--duration-s 1", params={"concurrency": 4, "max_steps": 500})
    assert time.perf_counter() - start < 1, message


def test_cli_reports_one_line_errors(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("timestamp\tprompt_tokens\toutput_tokens\n0\t5\t3\n")
    assert main(["trace", "--from-csv", str(bad), "-o", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tab-separated" in err and str(bad) in err
    assert main(["trace", "--from-csv", str(tmp_path), "-o", str(tmp_path / "o.npz")]) == 2
    assert "is a folder" in capsys.readouterr().err
    good = tmp_path / "good.csv"
    good.write_text(HEAD + "0,5,3\n")
    (tmp_path / "file").write_text("x")
    assert main(["trace", "--from-csv", str(good), "-o", str(tmp_path / "file" / "o.npz")]) == 2
    assert "not a folder" in capsys.readouterr().err


ROWS_2M = 2_000_000
# Peak memory from VmHWM: ru_maxrss survives exec on Linux, so a child started from pytest would report the
# parent's peak.
SCRIPT = """
import sys, time
def peak_mb():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024
from scenarios import SCENARIOS, ScenarioError
from scenarios.realtrace import build_real_trace
print("IMPORT_MB", peak_mb())
start = time.perf_counter()
try:
    build_real_trace("csv:big", SCENARIOS["azure-code"].params({"csv": sys.argv[1], "duration_s": None}))
except ScenarioError as exc:
    print("ERROR", exc)
print("SECONDS", time.perf_counter() - start)
print("PEAK_MB", peak_mb())
"""


def test_two_million_rows_fail_fast_in_bounded_memory(tmp_path) -> None:
    """2,000,000 rows: read in chunks, refused before simulating (suggesting --duration-s) in well under 30 s and
    300 MB (the whole process: importing scenarios takes about 120 MB, numba included)."""
    path = tmp_path / "big.csv"
    with open(path, "w") as fh:
        fh.write("id," + HEAD)
        step = 100_000
        for lo in range(0, ROWS_2M, step):
            fh.write("".join(f"{i},{i * 0.01:.2f},{100 + i % 50},{50 + i % 100}\n" for i in range(lo, lo + step)))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=False)
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    print(proc.stdout, proc.stderr[-2000:])
    assert "--duration-s 2100" in out["ERROR"] and "2000000 requests" in out["ERROR"], proc.stdout
    assert str(path) in out["ERROR"] and "max_steps=100000" in out["ERROR"]
    assert float(out["SECONDS"]) < 30
    assert float(out["PEAK_MB"]) < 300, out  # the whole process, imports included
