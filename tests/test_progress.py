"""What a run says while it runs: the work before the first unit, units with a time left measured from the work
done, plain lines in a log, and each scenario's time as it ends."""

from __future__ import annotations

import io
import re

import pytest

from harness.cli import main
from harness.run import progress


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_on_a_terminal_status_lines_then_a_bar_with_the_estimate_and_scenario_lines() -> None:
    out = io.StringIO()
    bar = progress.Progress(True, out, tty=True)
    bar.status("loading the implementations")
    assert out.getvalue() == "kvblock-bench: loading the implementations\n"
    bar.start(4)
    progress.status(bar, "paper: the trace")
    bar("paper flat batched")
    assert bar.left() is None  # the first unit's start-up is no rate
    bar("paper dict batched")
    bar.scenario_done("paper", 83.0)
    bar.close()
    text = out.getvalue()
    assert "now: paper: the trace" in text and "2/4 units" in text
    assert " left; done: paper dict batched" in text  # the estimate from the work done since (time_left)
    assert "kvblock-bench: paper done in 1 min 23 s" in text


def test_the_time_left_is_the_measured_time_per_work_done_times_the_work_left() -> None:
    assert progress.time_left(10.0, 0.0, 100.0) is None  # nothing done: nothing measured to go by
    assert progress.time_left(10.0, 25.0, 100.0) == 30.0
    assert progress.time_left(10.0, 100.0, 100.0) == 0.0
    assert progress.time_left(10.0, 4.0, 100.0) is None  # under MIN_FRACTION of the work: no estimate yet


def test_the_first_units_start_up_is_left_out_of_the_rate() -> None:
    # 600 s for the first unit (compilation), then 10 s per unit of work: 70 units left take 700 s, not 6,000
    assert progress.time_left(900.0, 30.0, 100.0, since=(600.0, 1.0)) == 70 * 300.0 / 29.0
    assert progress.time_left(600.0, 1.0, 10.0, since=(600.0, 1.0)) is None


def test_units_weigh_their_scenarios_work_not_one_each() -> None:
    clock = Clock()
    bar = progress.Progress(True, io.StringIO(), tty=False)
    bar.clock = clock
    bar.start(4, work=2 * 100 + 2 * 300)  # two scenarios of two units: 100 and 300 sequence-steps per unit
    bar.scenario(2, 100, 100)
    clock.now = 5.0
    bar("small 1")
    clock.now = 10.0
    bar("small 2")
    assert bar.left() == 30.0  # half the units are done, a quarter of the work: 30 s left, not 10 s
    bar.scenario(2, 300, 150)  # its trace turned out lighter than planned: the total follows
    assert bar.total_work == 500 and bar.left() == 15.0


def test_a_log_gets_plain_lines_at_a_bounded_rate_and_one_line_per_scenario_end() -> None:
    out, clock = io.StringIO(), Clock()
    bar = progress.Progress(True, out, tty=False)
    bar.clock = clock
    bar.status("loading the implementations")
    bar.start(6)
    bar.scenario(3, 1, 1)
    for i in range(3):
        clock.now += 1.0
        bar(f"paper unit {i}")  # within PLAIN_EVERY_S of the start: no units line
    bar.scenario_done("paper", 3.0)
    progress.status(bar, "concurrency-64: the trace")
    clock.now += progress.PLAIN_EVERY_S
    bar("concurrency-64 unit 0")
    bar("concurrency-64 unit 1")  # too soon after the last line
    bar("concurrency-64 unit 2")  # the last unit: always said
    bar.scenario_done("concurrency-64", 15.0)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines == ["kvblock-bench: loading the implementations",
                     "kvblock-bench: paper done in 3 s (3/6 units, about 3 s left)",
                     "kvblock-bench: concurrency-64: the trace",
                     "kvblock-bench: 4/6 units, 18 s elapsed, about 11 s left; done: concurrency-64 unit 0",
                     "kvblock-bench: 6/6 units, 18 s elapsed; done: concurrency-64 unit 2",
                     "kvblock-bench: concurrency-64 done in 15 s (6/6 units)"]


def test_a_log_says_each_status_once() -> None:
    out = io.StringIO()
    bar = progress.Progress(True, out, tty=False)
    bar.start(2)
    for what in ("paper: warming up flat (batched)", "paper: warming up flat (batched)", "flat batched: failed"):
        bar.status(what)
    bar.scenario_done("paper", 3.0)
    bar.status("flat batched: failed")  # met again in the next scenario: said again
    lines = [line for line in out.getvalue().splitlines() if " done in " not in line]
    assert lines == ["kvblock-bench: paper: warming up flat (batched)", "kvblock-bench: flat batched: failed",
                     "kvblock-bench: flat batched: failed"]


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


@pytest.mark.slow  # an end-to-end run, ~10 s (make test-slow, .ci/run)
def test_a_run_announces_its_work_before_the_first_unit(tmp_path, capsys) -> None:
    assert main(["run", "--results", str(tmp_path), "--quick", "--reps", "2", "--scenario", "paper", "--impl", "flat",
                 "--regime", "batched,per-call", "--no-paced", "--no-l1d", "--no-table-copy", "--no-allocations"]) == 0
    err = capsys.readouterr().err
    order = ["kvblock-bench: loading the implementations", "kvblock-bench: calibrating the timers",
             "paper: the trace", "paper: warming up flat (batched, per-call; first calls"]
    assert err.count("warming up") == 1, err  # once per design, not per regime and repetition
    positions = [err.find(words) for words in order]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), err[:2000]
    first_units_line = re.search(r"^kvblock-bench: \d+/\d+ units", err, re.M)  # at least the last unit's
    assert first_units_line and first_units_line.start() > positions[-1]


def test_a_run_in_a_log_prints_plain_lines_and_each_scenarios_time_as_it_ends(tmp_path, capsys) -> None:
    assert main(["run", "--results", str(tmp_path), "--quick", "--scenario", "paper,concurrency-256",
                 "--impl", "flat", "--regime", "batched", "--no-paced", "--no-l1d", "--no-table-copy",
                 "--no-allocations"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    took = r"done in (\d+ min )?\d+ s"
    assert len(re.findall(rf"^kvblock-bench: paper {took} \(\d+/\d+ units, about [\d a-z]+ left\)$", err, re.M)) == 1
    assert len(re.findall(rf"^kvblock-bench: concurrency-256 {took} \(same trace as paper: its rows copied\) ", err,
                          re.M)) == 1
    assert re.search(r"^kvblock-bench: (\d+)/\1 units, ", err, re.M)  # the last unit's line


@pytest.mark.slow
def test_the_units_a_run_counts_are_the_units_it_plans(tmp_path, capsys) -> None:
    """A study that runs in each implementation's worker (L1D) ticks there: the count ends at the total, never past."""
    assert main(["run", "--results", str(tmp_path), "--quick", "--scenario", "paper", "--impl", "flat,cpp-flat",
                 "--regime", "batched", "--no-paced", "--no-table-copy", "--no-allocations"]) == 0
    counts = [(int(n), int(total)) for n, total in re.findall(r"(\d+)/(\d+) units", capsys.readouterr().err)]
    assert counts and all(n <= total for n, total in counts), counts
    assert counts[-1][0] == counts[-1][1], counts
