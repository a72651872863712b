"""scripts/compare_pairs.py: false alarms and detection counted per threshold; the README's section is what the
committed results file says (or the placeholder while there is none); end to end on a tiny configuration."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from harness.output import sections
from harness.output.compare import DEFAULT_THRESHOLD_PCT

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_pairs.py"
spec = importlib.util.spec_from_file_location("compare_pairs", SCRIPT)
compare_pairs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_pairs)
RESULTS = ROOT / "results" / "compare_pairs" / "pairs.json"
PLUGIN = compare_pairs.PLUGIN


def row(impl: str, ratio: float, low: float, high: float, regime: str = "batched", metric: str = "seq_step_ns"):
    return {"impl": impl, "regime": regime, "metric": metric, "ratio": ratio, "ci_low": low, "ci_high": high}


def pair(index: int, flat: tuple[float, float, float], slowed: tuple[float, float, float]) -> dict:
    rows = [row("flat", *flat), row("flat", 1.0, 0.97, 1.03, metric="lookup_ns"), row(PLUGIN, *slowed),
            row(PLUGIN, 1.2, 1.15, 1.25, regime="per-call"),  # the per-call regime: a control, not slowed
            row(PLUGIN, 1.0, 0.9, 1.1, metric="lookup_ns")]
    return {"pair": index, "order": "BASE then NEW", "exit_status": 1, "counts": {},
            "runs": {"BASE": {"run_id": "a", "seconds": 60.0}, "NEW": {"run_id": "b", "seconds": 62.0}},
            "slowed": [{**row(PLUGIN, *slowed), "verdict": "slower"}], "failing": [], "rows": rows}


PAIRS = [pair(1, (1.04, 1.01, 1.07), (1.33, 1.2, 1.45)), pair(2, (0.98, 0.9, 1.05), (1.30, 1.08, 1.5))]


def test_false_alarms_and_detection_are_counted_per_threshold() -> None:
    table = {t["threshold_pct"]: t for t in compare_pairs.by_threshold(PAIRS, (0, 5, 10, 20))}
    # at 0 %: flat's 1.04 [1.01-1.07] and the plug-in's per-call 1.2 [1.15-1.25] are alarms (pair 1), and the
    # per-call control in pair 2 as well; both slowed rows are caught
    assert (table[0]["false_slower_rows"], table[0]["false_faster_rows"]) == (3, 0)
    assert (table[0]["pairs_with_false_alarm"], table[0]["pairs_caught"]) == (2, 2)
    assert table[0]["rows_compared"] == 8
    assert (table[10]["false_alarm_rows"], table[10]["pairs_caught"]) == (2, 1)  # 1.08 is not beyond 10 %
    assert (table[20]["false_alarm_rows"], table[20]["pairs_caught"]) == (0, 0)
    assert compare_pairs.suggested(list(table.values())) is None
    clean = [pair(1, (1.0, 0.95, 1.05), (1.33, 1.2, 1.45))]
    clean[0]["rows"][3] = row(PLUGIN, 1.0, 0.95, 1.05, regime="per-call")
    assert compare_pairs.suggested(compare_pairs.by_threshold(clean, (0, 5, 10))) == 0


def document(pairs: list[dict]) -> dict:
    return {"commit": "abc", "machine": "Test CPU (2 CPUs)", "date": "2026-12-01", "run_args": "--scenario paper",
            "passes": 0.75, "default_threshold_pct": 10.0,
            "by_threshold": compare_pairs.by_threshold(pairs, (5, 10)), "suggested_threshold_pct": None,
            "pairs": pairs}


def test_the_readme_section_is_rewritten_from_the_results_file(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{compare_pairs.BEGIN}\nold\n{compare_pairs.END}\noutro\n")
    results = tmp_path / "pairs.json"
    compare_pairs.write_readme(readme, results)  # no file yet: the placeholder
    assert compare_pairs.PLACEHOLDER in readme.read_text() and "old" not in readme.read_text()
    results.write_text(json.dumps(document(PAIRS)))
    compare_pairs.write_readme(readme, results)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n")
    assert "| 10 % (default) | 2 of 8 | 0 of 8 | 2 of 2 | 1 of 2 |" in text
    assert "pair 1: 1.33× [1.20–1.45] slower, exit 1" in text
    assert "(60-62 s a run, start to finish in its meta.json)" in text


def test_the_readme_says_what_the_committed_file_says() -> None:
    """The README's compare-pairs section is generated from results/compare_pairs/pairs.json (the placeholder
    while the measurement has not been committed); and the default threshold is one the measurement found
    clean: no false alarm, the slowed plug-in caught in every pair."""
    readme = sections.doc_path("compare-pairs").read_text()
    section = readme.split(compare_pairs.BEGIN, 1)[1].split(compare_pairs.END, 1)[0].strip()
    if not RESULTS.is_file():
        assert section == compare_pairs.PLACEHOLDER
        return
    doc = json.loads(RESULTS.read_text())
    assert section == compare_pairs.render_markdown(doc).strip()
    default = next(t for t in doc["by_threshold"] if t["threshold_pct"] == DEFAULT_THRESHOLD_PCT)
    assert default["false_alarm_rows"] == 0 and default["pairs_caught"] == default["pairs"]


@pytest.mark.slow
def test_the_script_runs_a_tiny_pair_end_to_end(tmp_path: Path) -> None:
    """One pair of quick runs of flat and the slowed plug-in (20 extra passes: unmistakably slower): the results
    file holds the pair, its exit status 1 from compare, the slowed rows caught, the counts per threshold."""
    args = ["--pairs", "1", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--passes", "20",
            "--thresholds", "0,10", "--run-args", "--quick --scenario paper --impl flat,slowed_flat:SlowedFlat "
            "--regime batched --no-paced --no-l1d --no-allocations --no-table-copy"]
    status = compare_pairs.main(args)
    doc = json.loads((tmp_path / "out" / "pairs.json").read_text())
    assert status in (0, 1)  # 1 when this loaded machine made a false alarm of a one-repetition run
    (only,) = doc["pairs"]
    assert only["exit_status"] == 1 and [s["verdict"] for s in only["slowed"]] == ["slower"]
    assert only["slowed"][0]["ratio"] > 2
    assert [t["threshold_pct"] for t in doc["by_threshold"]] == [0, 10]
    assert all(t["pairs_caught"] == 1 for t in doc["by_threshold"])
    assert (tmp_path / "out" / "pairs.md").read_text() == compare_pairs.render_markdown(doc)
    # --resume compares the runs already there instead of running them again: the same runs, the same figures
    assert compare_pairs.main([*args, "--resume"]) == status
    again = json.loads((tmp_path / "out" / "pairs.json").read_text())
    ids = {side: (run["run_id"], run["commit"]) for side, run in only["runs"].items()}
    assert {side: (run["run_id"], run["commit"]) for side, run in again["pairs"][0]["runs"].items()} == ids
    assert again["by_threshold"] == doc["by_threshold"]
    assert len(list((tmp_path / "work" / "pair1" / "base").glob("2*"))) == 1
