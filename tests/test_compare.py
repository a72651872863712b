"""``kvblock-bench compare``: verdicts, reasons, machine refusal, formats and exit status, on synthetic runs;
and the interval of NEW/BASE (the log-scale combination) against a direct bootstrap of two runs' samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.base.files import write_json
from harness.base.metrics import Work, cell_blocks
from harness.base.rows import Row, write_rows
from harness.base.stats import Estimate, independent_ratio, ratio_of_sums, rep_draws
from harness.cli import main
from harness.errors import TooFewPairs
from harness.output.compare import MIN_PAIRS, Rules, compare_runs, load_run, verdict

MACHINE = {"cpu_model": "Test CPU", "cpu_count": 2, "caches": {"L1d": "32K (8-way)"},
           "versions": {"python": "3.11.7", "numpy": "2.4.6", "numba": "0.68.1", "llvmlite": "0.50.0"}}
DIGEST = "a" * 64


def timed(metric: str, value: float, half: float = 0.05, impl: str = "flat", regime: str = "batched",
          scenario: str = "paper", **columns) -> Row:
    """A timed row with a ±``half`` interval (relative), as a run writes it."""
    columns = {"reps": 3, "steps": 2000, "seqs": 256, "driver": "compiled", **columns}
    return Row(scenario, impl, regime, metric, value, "ns", "tsc", ci_low=value * (1 - half),
               ci_high=value * (1 + half), **columns)


def make_run(folder: Path, rows: list[Row], meta: dict | None = None, traces: dict | None = None,
             **config) -> Path:
    folder.mkdir(parents=True)
    write_rows(folder / "results.csv", rows)
    meta = {**MACHINE, "git_commit": "abc", "started": "2026-12-01T00:00:00+0000", "complete": True,
            "config": {"quick": "False", "reps": "3", "root": str(folder.parent), **config},
            "traces": {"paper": DIGEST} if traces is None else traces, **(meta or {})}
    write_json(folder / "meta.json", meta)
    return folder


def three(scale: float = 1.0, half: float = 0.05, **columns) -> list[Row]:
    return [timed("seq_step_ns", 8.0 * scale, half, **columns), timed("lookup_ns", 2.0 * scale, half, **columns),
            timed("alloc_free_ns", 10.0 * scale, half, **columns),
            timed("step_p99_ns", 3000.0 * scale, half, **columns)]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["compare", *argv])
    out, err = capsys.readouterr()
    return status, out, err


# -- the interval of NEW/BASE ----------------------------------------------------------------------------------
def test_independent_ratio_adds_log_half_widths_in_quadrature() -> None:
    est = independent_ratio(Estimate(12.0, 10.0, 15.0), Estimate(10.0, 8.0, 11.0))
    assert est.value == pytest.approx(1.2)
    assert est.low == pytest.approx(1.2 * np.exp(-np.hypot(np.log(1.2), np.log(1.1))))
    assert est.high == pytest.approx(1.2 * np.exp(np.hypot(np.log(1.25), np.log(1.25))))
    assert np.isnan(independent_ratio(Estimate(1.0, np.nan, np.nan), Estimate(1.0, 0.9, 1.1)).low)
    assert np.isnan(independent_ratio(Estimate(1.0, 0.0, 1.1), Estimate(1.0, 0.9, 1.1)).low)
    # a figure outside its own interval (possible with a percentile bootstrap): that side's half-width is 0
    assert independent_ratio(Estimate(1.0, 1.1, 1.2), Estimate(1.0, 1.0, 1.0)).low == pytest.approx(1.0)


def _run_samples(rng: np.random.Generator, level: float, reps: int = 3, steps: int = 400) -> np.ndarray:
    """Per-step times of ``reps`` repetitions: a step's own cost, a per-repetition level (fresh managers,
    another process) and per-step noise."""
    base = 1000.0 * (1 + 0.3 * np.sin(np.arange(steps) / 17.0))
    rep_level = level * np.exp(rng.normal(0, 0.05, size=(reps, 1)))
    return base * rep_level * np.exp(rng.normal(0, 0.2, size=(reps, steps)))


def _estimate(per_rep: np.ndarray, slices: list[tuple[int, int]]) -> Estimate:
    """A run's seq_step_ns figure and interval, exactly as the run computes it."""
    from harness.base.drivers import StepTimes

    steps = per_rep.shape[1]
    samples = [StepTimes(np.zeros((steps, 5)), np.zeros(steps, dtype=np.int64), x, 1.0, "tsc") for x in per_rep]
    time, work = cell_blocks(Work.uniform(steps, 256), samples, samples, slices)["seq_step_ns"]
    return ratio_of_sums(time, work)


def test_the_combined_interval_matches_a_bootstrap_over_both_runs_samples() -> None:
    """Why the rows' intervals are combined rather than the raw samples resampled again: on synthetic runs the
    log-scale combination of each run's own interval and a direct bootstrap drawing both runs' slices and
    repetitions independently give the same interval (within 10 % of its log width on each side)."""
    rng = np.random.default_rng(7)
    slices = [(i, i + 20) for i in range(0, 400, 20)]
    base, new = _run_samples(rng, 1.0), _run_samples(rng, 1.25)
    combined = independent_ratio(_estimate(new, slices), _estimate(base, slices))
    # the direct bootstrap: each resample draws slices and repetitions of each run independently
    from harness.base.stats import block_medians

    def resampled(per_rep: np.ndarray, seed: int) -> np.ndarray:
        blocks = block_medians(per_rep, slices)
        idx = np.random.default_rng(seed).integers(0, len(slices), size=(blocks.shape[0] - 1, len(slices)))
        return np.take_along_axis(blocks[1:], idx, axis=1).sum(axis=1)

    ratios = resampled(new, 1) / resampled(base, 2)
    low, high = np.percentile(ratios, [2.5, 97.5])
    point = np.log(combined.value)
    for ours, theirs in ((combined.low, low), (combined.high, high)):
        assert abs(np.log(ours) - np.log(theirs)) < 0.1 * abs(point - np.log(theirs)) + 0.01
    assert rep_draws(3).shape[1] == 3


def test_the_combined_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    """Independent lognormal figures with exact 95 % intervals: the combination covers the true ratio in about
    95 % of trials (neither much narrower nor much wider)."""
    rng = np.random.default_rng(11)
    z, sd_a, sd_b, hits, trials = 1.959964, 0.08, 0.05, 0, 4000
    for _ in range(trials):
        a, b = rng.normal(np.log(1.3), sd_a), rng.normal(0.0, sd_b)
        est = independent_ratio(Estimate(np.exp(a), np.exp(a - z * sd_a), np.exp(a + z * sd_a)),
                                Estimate(np.exp(b), np.exp(b - z * sd_b), np.exp(b + z * sd_b)))
        hits += est.contains(1.3)
    assert 0.94 < hits / trials < 0.96


@pytest.mark.parametrize(("low", "high", "expected"), [
    (1.11, 1.3, "slower"), (1.0, 1.3, "no difference"), (1.05, 1.09, "no difference"), (0.7, 0.9, "faster"),
    (0.7, 0.95, "no difference"), (0.95, 1.05, "no difference")])
def test_a_row_fails_only_when_its_whole_interval_lies_beyond_the_threshold(low, high, expected) -> None:
    assert verdict(Estimate((low + high) / 2, low, high), 0.10)[0] == expected


def test_notes_say_what_no_difference_hides() -> None:
    assert verdict(Estimate(1.07, 1.05, 1.09), 0.10)[1] == ["changed by less than the 10 % threshold"]
    assert "inconclusive" in verdict(Estimate(1.2, 1.0, 1.4), 0.10)[1][0]
    assert verdict(Estimate(1.0, 0.95, 1.05), 0.10)[1] == []


# -- whole runs ------------------------------------------------------------------------------------------------
def test_same_figures_pass(tmp_path: Path, capsys) -> None:
    a, b = make_run(tmp_path / "a", three()), make_run(tmp_path / "b", three(1.02))
    status, out, _ = run_cli(capsys, str(a), str(b))
    assert status == 0
    assert "0 slower, 0 faster, 3 no difference, 0 not comparable" in out
    assert "step_p99_ns" not in out  # not a default metric


def test_a_third_slower_fails_with_exit_1_and_faster_passes(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", [*three(1.33)[:1], *three()[1:]])
    c = make_run(tmp_path / "c", three(0.5))
    status, out, _ = run_cli(capsys, str(a), str(b))
    assert status == 1
    slower = [line for line in out.splitlines() if line.rstrip().endswith("slower")]
    assert len(slower) == 1 and "seq_step_ns" in slower[0] and "1.330×" in slower[0]
    status, out, _ = run_cli(capsys, str(a), str(c))
    assert status == 0 and "0 slower, 3 faster" in out
    # a higher threshold lets the same change through; the threshold is a percentage
    assert run_cli(capsys, str(a), str(b), "--threshold", "25%")[0] == 0


def test_runs_by_id_under_results(tmp_path: Path, capsys) -> None:
    make_run(tmp_path / "r1", three())
    make_run(tmp_path / "r2", three())
    assert run_cli(capsys, "r1", "r2", "--results", str(tmp_path))[0] == 0


def test_not_comparable_rows_say_why(tmp_path: Path) -> None:
    base_rows = [*three(), *three(impl="dict", driver="python"), *three(impl="list"), *three(impl="gone"),
                 *three(scenario="beam-search")]
    new_rows = [*three(reps=9),  # other repetitions: compared, and said
                *three(impl="dict", driver="compiled"),  # another driver: compared, and said
                Row("paper", "list", "batched", "correctness", float("nan"), "", "trace check", "failed", "boom"),
                *three(impl="new-design"), *three(scenario="beam-search")]
    new_rows.append(Row("paper", "flat", "per-call", "seq_step_ns", float("nan"), "ns", "tsc", "skipped"))
    base_rows.append(timed("seq_step_ns", 5.0, regime="per-call"))
    base_rows.append(Row("beam-search", "flat", "per-call", "lookup_ns", 5.0, "ns", "tsc", reps=3, steps=2000,
                         seqs=256))  # no interval
    new_rows.append(timed("lookup_ns", 5.0, regime="per-call", scenario="beam-search"))
    a = make_run(tmp_path / "a", base_rows, traces={"paper": DIGEST, "beam-search": "b" * 64})
    b = make_run(tmp_path / "b", new_rows, traces={"paper": DIGEST, "beam-search": "b" * 64})
    c = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", b, tmp_path))
    by = {(r.scenario, r.impl, r.regime, r.metric): r for r in c.rows}
    assert by[("paper", "flat", "batched", "seq_step_ns")].notes == ["repetitions 3 -> 9"]
    assert by[("paper", "dict", "batched", "lookup_ns")].notes == ["driver python -> compiled"]
    assert by[("paper", "list", "batched", "seq_step_ns")].why == "failed in NEW"
    assert by[("paper", "gone", "batched", "seq_step_ns")].why == "missing in NEW"
    assert by[("paper", "new-design", "batched", "seq_step_ns")].why == "missing in BASE"
    assert by[("paper", "flat", "per-call", "seq_step_ns")].why == "skipped in NEW"
    assert by[("beam-search", "flat", "per-call", "lookup_ns")].why == "no interval in BASE"
    assert by[("beam-search", "flat", "batched", "seq_step_ns")].verdict == "no difference"
    assert all(r.verdict == "not comparable" for r in c.rows if r.why)
    # what BASE measured and NEW did not (failed, dropped, skipped) is lost: it fails the comparison unless allowed
    assert {(r.impl, r.regime) for r in c.lost} == {("list", "batched"), ("gone", "batched"), ("flat", "per-call")}
    assert c.exit_status == 1 and c.failures() == ["NEW lost 7 figures BASE has"]
    allowed = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", b, tmp_path), rules=Rules(allow_lost=True))
    assert allowed.exit_status == 0 and allowed.lost


def test_figures_neither_run_measured_are_left_out_with_a_note(tmp_path: Path) -> None:
    """The step regime's per-operation figures are skipped in every run (it times whole steps): no row, a
    note; a figure skipped in one run only, or for another reason in each, stays a row that says why."""
    why = "one step() call per step is timed as one region: no per-operation figure"

    def step_rows(lookup_how: str) -> list[Row]:
        return [timed("seq_step_ns", 8.0, regime="step"),
                Row("paper", "flat", "step", "lookup_ns", float("nan"), "ns", "tsc", "skipped", lookup_how),
                Row("paper", "flat", "step", "alloc_free_ns", float("nan"), "ns", "tsc", "skipped", why)]

    a = make_run(tmp_path / "a", [*three(), *step_rows(why)])
    b = make_run(tmp_path / "b", [*three(), *step_rows("another reason")])
    c = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", a, tmp_path))
    assert [(r.regime, r.metric) for r in c.rows if r.regime == "step"] == [("step", "seq_step_ns")]
    assert c.count("not comparable") == 0
    assert c.run_notes == ["2 figures measured in neither run are left out (lookup_ns (step), alloc_free_ns (step); "
                           f"e.g. skipped: {why})"]
    c = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", b, tmp_path))
    by = {(r.regime, r.metric): r for r in c.rows}
    assert by[("step", "lookup_ns")].why == "skipped in BASE" and ("step", "alloc_free_ns") not in by


def test_a_quick_run_beside_a_full_one_is_refused_unless_allowed_and_then_nothing_compares(tmp_path: Path,
                                                                                            capsys) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", three(), traces={"paper": "c" * 64}, quick="True", reps="1")
    status, out, err = run_cli(capsys, str(a), str(b))
    assert status == 2 and not out and len(err.strip().splitlines()) == 1 and "--allow-quick-mismatch" in err
    status, out, err = run_cli(capsys, str(a), str(b), "--allow-quick-mismatch")
    assert status == 2 and out.count("not comparable: different trace") == 3
    assert "no figure comparable" in out.splitlines()[0] and "no figure of the runs is comparable" in err
    assert "made with other options: quick False (BASE) -> True (NEW)" in out
    assert "made with other options: reps 3 (BASE) -> 1 (NEW)" in out


def test_runs_without_digests_compare_the_rows_work(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path / "a", three(), traces={})
    a_meta = json.loads((a / "meta.json").read_text())
    del a_meta["traces"]
    write_json(a / "meta.json", a_meta)
    b = make_run(tmp_path / "b", three(steps=200))
    _, out, _ = run_cli(capsys, str(a), str(b))
    assert "BASE records no trace digests" in out
    assert out.count("not comparable: different trace (steps 2000 -> 200)") == 3


def test_other_machines_are_refused_in_one_line_unless_allowed(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", three(), meta={"cpu_model": "Other CPU",
                                                 "versions": {**MACHINE["versions"], "numba": "0.61.0"}})
    status, out, err = run_cli(capsys, str(a), str(b))
    assert status == 2 and not out and len(err.strip().splitlines()) == 1
    assert "cpu_model 'Test CPU' -> 'Other CPU'" in err and "versions.numba '0.68.1' -> '0.61.0'" in err
    assert "--allow-other-machine" in err
    status, out, _ = run_cli(capsys, str(a), str(b), "--allow-other-machine", "--format", "json")
    doc = json.loads(out)
    assert status == 0 and doc["other_machine"] and all("other machine" in r["notes"] for r in doc["rows"])


def test_a_run_without_machine_is_refused(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", three())
    (b / "meta.json").unlink()
    status, _, err = run_cli(capsys, str(a), str(b))
    assert status == 2 and "(not recorded)" in err


def test_markdown_puts_the_verdict_first_and_folds_the_rest(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", [*three(1.5)[:1], *three()[1:]])
    status, out, _ = run_cli(capsys, str(a), str(b), "--format", "markdown")
    assert status == 1
    assert out.startswith("### kvblock-bench compare: ❌ FAILED: 1 slower beyond the threshold")
    table, folded = out.split("<details>")
    assert "| **slower** | `paper` | `flat` | batched | `seq_step_ns` |" in table
    assert "2 figures with no difference" in folded and folded.rstrip().endswith("</details>")


def test_json_holds_every_row_and_the_exit_status(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", three(1.5))
    status, out, _ = run_cli(capsys, str(a), str(b), "--format", "json", "--metric", "seq_step_ns,step_p99_ns")
    doc = json.loads(out)
    assert status == doc["exit_status"] == 1
    assert doc["threshold"] == pytest.approx(0.10) and doc["metrics"] == ["seq_step_ns", "step_p99_ns"]
    assert [r["metric"] for r in doc["rows"]] == ["seq_step_ns", "step_p99_ns"]
    assert doc["rows"][0]["verdict"] == "slower" and doc["rows"][0]["ci_low"] > 1.1
    assert doc["counts"]["slower"] == 2


@pytest.mark.parametrize("argv", [
    ["MISSING", "MISSING2"], ["{a}", "{a}", "--metric", "lookp_ns"], ["{a}", "{a}", "--threshold", "ten"],
    ["{a}", "{a}", "--threshold", "-5"], ["{a}", "{a}", "--format", "html"], ["{a}", "{bad}"], ["{a}", "{badcsv}"],
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, argv: list[str]) -> None:
    a = make_run(tmp_path / "a", three())
    bad = make_run(tmp_path / "bad", three())
    (bad / "meta.json").write_text("{not json")
    badcsv = make_run(tmp_path / "badcsv", three())
    (badcsv / "results.csv").write_text("nonsense\n")
    argv = [x.format(a=a, bad=bad, badcsv=badcsv) for x in argv]
    status, _, err = run_cli(capsys, *argv)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# -- the headline: inconclusive is not "nothing slower"; interleaved or apart ------------------------------------
def test_the_headline_counts_inconclusive_rows_and_the_smallest_slowdown_it_could_detect(tmp_path: Path,
                                                                                          capsys) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", [*three(1.1, half=0.2)[:1], *three()[1:]])  # seq_step_ns 1.1x, wide
    status, out, _ = run_cli(capsys, str(a), str(b))
    lines = out.splitlines()
    assert status == 0 and "1 of 3 rows inconclusive" in lines[0] and "nothing slower" in lines[0]
    assert "3 no difference (1 of them inconclusive" in lines[1]
    # the widest row needs NEW/BASE beyond 1.1 x 1.1 / low to lie wholly past the threshold
    row = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", b, tmp_path)).rows[0]
    need = 1.1 * row.ratio / row.ci_low - 1
    assert f"could detect in every comparable row: {need * 100:+.1f} % (the least precise row: flat batched " \
           "seq_step_ns)" in lines[2]
    assert "runs made apart, not interleaved" in lines[3]
    status, out, _ = run_cli(capsys, str(a), str(b), "--fail-on-inconclusive", "--format", "markdown")
    assert status == 1 and out.startswith("### kvblock-bench compare: ❌ FAILED: 1 inconclusive")
    _, out, _ = run_cli(capsys, str(a), str(b), "--format", "markdown")
    assert out.startswith("### kvblock-bench compare: ⚠️ nothing slower beyond the threshold, but 1 of 3 rows")
    _, out, _ = run_cli(capsys, str(a), str(a), "--format", "markdown")
    assert out.startswith("### kvblock-bench compare: ✅ nothing slower beyond the threshold (every comparable row "
                          "conclusive)")


def test_a_dropped_implementation_is_named_in_the_headline_and_fails_unless_allowed(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path / "a", [*three(), *three(impl="dict")])
    b = make_run(tmp_path / "b", three())
    status, out, _ = run_cli(capsys, str(a), str(b))
    assert status == 1 and out.splitlines()[0] == "kvblock-bench compare: FAILED: NEW lost 3 figures BASE has"
    lost = next(line for line in out.splitlines() if line.startswith("NEW lost figures BASE has"))
    assert "dict (batched seq_step_ns: missing in NEW, batched lookup_ns: missing in NEW" in lost
    assert "--allow-lost accepts it" in lost
    status, out, _ = run_cli(capsys, str(a), str(b), "--allow-lost", "--format", "json")
    doc = json.loads(out)
    assert status == doc["exit_status"] == 0 and doc["counts"]["lost"] == 3
    status, out, _ = run_cli(capsys, str(b), str(a))  # a figure NEW gained is not a loss
    assert status == 0 and "lost" not in out


def test_runs_of_one_ab_compare_with_their_paired_intervals(tmp_path: Path, capsys) -> None:
    """NEW's ab.json (written by kvblock-bench ab) pairs NEW/BASE: compare uses it, and says the runs were
    interleaved; a figure it lacks keeps the independent interval, said so."""
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", [*three(1.05)[:1], *three()[1:]])
    paired = [{"scenario": "paper", "impl": "flat", "regime": "batched", "metric": "seq_step_ns", "ratio": 1.05,
               "ci_low": 1.03, "ci_high": 1.07, "pairs": [1.04, 1.05, 1.06, 1.05, 1.05]}]
    write_json(b / "ab.json", {"sides": {"BASE": {"run_id": "a"}, "NEW": {"run_id": "b"}}, "paired": paired})
    c = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", b, tmp_path))
    assert c.interleaved and (c.rows[0].ci_low, c.rows[0].ci_high) == (1.03, 1.07)
    assert c.rows[0].notes == ["changed by less than the 10 % threshold"]
    assert c.rows[1].notes == ["independent interval (not paired)"]
    _, out, _ = run_cli(capsys, str(a), str(b))
    assert "measured in one run, side by side slice by slice (kvblock-bench ab): intervals paired" in out
    c = compare_runs(load_run("BASE", b, tmp_path), load_run("NEW", b, tmp_path))  # another BASE: not paired
    assert not c.interleaved


@pytest.mark.parametrize(("pairs", "config"), [
    ([1.3, 1.31], {}),  # two pairs of processes recorded
    (None, {"reps": "1"}),  # an ab.json from before pairs were recorded: one repetition
    (None, {"reps": "8", "processes": "2"}),  # eight repetitions in two processes each side
    (None, {"reps": "2"}),  # two repetitions
    ([], {}),  # no pair at all: the interval was one process's slices
])
def test_an_ab_row_over_too_few_pairs_of_processes_gets_no_verdict(tmp_path: Path, capsys, pairs, config) -> None:
    """A paired interval resting on fewer than MIN_PAIRS pairs of worker processes cannot cover what varies between
    processes: however narrow, it gives no verdict (not "slower"), and the comparison exits 4, "too few pairs"."""
    a = make_run(tmp_path / "a", three(), **config)
    b = make_run(tmp_path / "b", [timed("seq_step_ns", 8.0 * 1.3), *three()[1:]], **config)
    row = {"scenario": "paper", "impl": "flat", "regime": "batched", "metric": "seq_step_ns", "ratio": 1.3,
           "ci_low": 1.29, "ci_high": 1.31, **({} if pairs is None else {"pairs": pairs})}
    write_json(b / "ab.json", {"sides": {"BASE": {"run_id": "a"}, "NEW": {"run_id": "b"}}, "paired": [row]})
    c = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", b, tmp_path))
    first = c.rows[0]
    assert first.too_few and first.verdict == "not comparable" and "too few pairs for a verdict" in first.why
    assert first.ratio == 1.3 and c.exit_status == TooFewPairs.exit_status == 4 and not c.slower
    status, out, _ = run_cli(capsys, str(a), str(b))
    assert status == 4 and f"too few pairs for a verdict: use at least {MIN_PAIRS}" in out.splitlines()[0]
    status, out, _ = run_cli(capsys, str(a), str(b), "--format", "markdown")
    assert out.startswith("### kvblock-bench compare: ⚠️ too few pairs")


def test_a_slower_row_with_enough_pairs_fails_beside_a_row_with_too_few(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", three())
    b = make_run(tmp_path / "b", [timed("seq_step_ns", 8.0 * 1.3), timed("lookup_ns", 2.0 * 1.3), *three()[2:]])
    rows = [{"scenario": "paper", "impl": "flat", "regime": "batched", "metric": metric, "ratio": 1.3,
             "ci_low": 1.25, "ci_high": 1.35, "pairs": [1.3] * n} for metric, n in (("seq_step_ns", MIN_PAIRS),
                                                                                     ("lookup_ns", 1))]
    write_json(b / "ab.json", {"sides": {"BASE": {"run_id": "a"}, "NEW": {"run_id": "b"}}, "paired": rows})
    c = compare_runs(load_run("BASE", a, tmp_path), load_run("NEW", b, tmp_path))
    assert [r.verdict for r in c.rows[:2]] == ["slower", "not comparable"] and c.exit_status == 1
