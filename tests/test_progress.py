"""What a run says while it runs: the work before the first unit as it happens, units without a guessed ETA."""

from __future__ import annotations

import io

from harness.cli import main
from harness.output import progress


def test_status_lines_before_the_bar_then_the_bar_counts_units_without_an_eta() -> None:
    out = io.StringIO()
    bar = progress.Progress(True, out)
    bar.status("loading the implementations")
    assert out.getvalue() == "kvblock-bench: loading the implementations\n"
    bar.start(4)
    progress.status(bar, "paper: the trace")
    bar("paper flat batched")
    bar.close()
    text = out.getvalue()
    assert "now: paper: the trace" in text and "1/4 units" in text and "done: paper flat batched" in text
    assert "<" not in text.split("loading the implementations", 1)[1]  # tqdm's remaining-time field is gone


def test_disabled_progress_and_plain_callbacks_say_nothing() -> None:
    out = io.StringIO()
    bar = progress.Progress(False, out)
    bar.status("anything")
    bar.start(3)
    bar("a unit")
    bar.close()
    assert out.getvalue() == ""
    done: list[str] = []
    progress.status(done.append, "ignored")  # a plain callback has no status line; nothing breaks
    assert done == []


def test_a_run_announces_its_work_before_the_first_unit(tmp_path, capsys) -> None:
    assert main(["run", "--results", str(tmp_path), "--quick", "--scenario", "paper", "--impl", "flat",
                 "--regime", "batched", "--no-paced", "--no-l1d", "--no-table-copy", "--no-allocations"]) == 0
    err = capsys.readouterr().err
    order = ["kvblock-bench: loading the implementations", "kvblock-bench: calibrating the timers",
             "paper: the trace", "paper: warming up flat batched"]
    positions = [err.find(words) for words in order]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), err[:2000]
    first_unit = err.find("1/")
    assert first_unit > positions[-1]
