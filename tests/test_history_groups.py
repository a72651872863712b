"""``kvblock-bench history --group N --anchor V``: releases measured a group at a time with the anchor in every group,
the groups bounded by the workers' measured memory, and releases of different groups compared through the anchor
(``harness/history/groups.py``, ``harness/history/anchored.py``); whole runs on the stand-in vLLM wheels of
``tests/history_standin.py``."""

from __future__ import annotations

import csv
import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.errors import InputError
from harness.history import figure, measure
from harness.history.anchored import canonical, on_anchor_scale
from harness.history.groups import GroupPlan, anchor_for, next_group, workers_that_fit
from harness.history.records import COLUMNS, METRICS, HistoryRow, raw_path, read_history, write_history
from harness.history.verdicts import paired_steps, steps
from tests.history_standin import PUBLISHED_VLLM, vllm_wheels

SMALL = ["--steps", "24", "--running", "12", "--num-blocks", "2048", "--prompt-mean", "40", "--output-mean", "30"]
VLLM_0_12_TO_0_34 = PUBLISHED_VLLM


def _all_groups(versions: list[str], plan: GroupPlan, fits=lambda n: 1 << 30) -> list[list[str]]:
    pending, out = list(versions), []
    while pending:
        group = next_group(pending, plan, fits(len(out)))
        out.append(group)
        pending = [v for v in pending if v not in group]
    return out


# -- the groups --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 3, 12, 32, 33, 40])
def test_every_release_is_measured_once_and_the_anchor_in_every_group(size) -> None:
    versions = VLLM_0_12_TO_0_34
    plan = GroupPlan(size, anchor_for(versions, size, None))
    groups = _all_groups(versions, plan)
    assert plan.anchor == "0.34.0" and all(plan.anchor in g and len(g) <= size for g in groups)
    others = [v for g in groups for v in g if v != plan.anchor]
    assert sorted(others) == sorted(versions[:-1]) and len(others) == len(set(others))
    assert all(g == sorted(g, key=lambda v: tuple(map(int, v.split(".")))) for g in groups)
    assert len(groups) == math.ceil(32 / (size - 1))


def test_an_anchor_in_the_middle_and_one_group_for_size_zero() -> None:
    versions = VLLM_0_12_TO_0_34
    groups = _all_groups(versions, GroupPlan(12, anchor_for(versions, 12, "0.24.0")))
    assert [len(g) for g in groups] == [12, 12, 11] and all("0.24.0" in g for g in groups)
    assert _all_groups(versions, GroupPlan(0, "0.34.0")) == [versions]


def test_a_group_shrinks_to_what_memory_holds_and_never_below_two() -> None:
    versions = VLLM_0_12_TO_0_34[:10]
    plan = GroupPlan(8, versions[-1])
    groups = _all_groups(versions, plan, fits=lambda n: 1 << 30 if n == 0 else 3)  # measured after the first group
    assert [len(g) for g in groups] == [8, 3]
    assert [len(g) for g in _all_groups(versions, plan, fits=lambda n: 0)] == [2] * 9
    assert workers_that_fit(0, 8 << 30) == 1 << 30  # nothing measured yet: no bound from memory
    assert workers_that_fit(1 << 30, 8 << 30) == 6  # 3/4 of the memory available, in workers of the peak measured


@pytest.mark.parametrize("size, anchor, words", [
    (1, None, "--group 1: a group holds the anchor and at least one release"),
    (4, "0.99.0", "--anchor 0.99.0: not one of the releases VERSIONS names (0.12.0 to 0.34.0)"),
])
def test_a_bad_group_or_anchor_is_refused_saying_why(size, anchor, words) -> None:
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        anchor_for(VLLM_0_12_TO_0_34, size, anchor)


# -- the table: a group column, read from tables written before it -------------------------------------------
def _row(version: str, value: float, group: int = 1, metric: str = "seq_step_ns", width: float = 0.02,
         status: str = "ok") -> HistoryRow:
    return HistoryRow("vllm", version, "off", "paper", metric, value, value * (1 - width), value * (1 + width),
                      status, 5, 100, "sha256:x", "machine", "0.1-0.1", "now", "cmd", "how", group)


def test_a_table_without_the_group_column_reads_as_one_group(tmp_path) -> None:
    rows = [_row("0.23.0", 100.0), _row("0.24.0", 120.0)]
    path = write_history(tmp_path / "history.csv", rows)
    text = path.read_text().splitlines()
    assert text[0].split(",")[-1] == "group" and "group" in COLUMNS
    with path.open(newline="") as fh:
        old = [{k: v for k, v in r.items() if k != "group"} for r in csv.DictReader(fh)]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[c for c in COLUMNS if c != "group"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(old)
    assert read_history(path) == rows  # group 1
    committed = Path(__file__).resolve().parent.parent / "results" / "history" / "sglang" / "history.csv"
    assert {r.group for r in read_history(committed)} == {1}  # a committed table written before the column
    grouped = Path(__file__).resolve().parent.parent / "results" / "history" / "vllm" / "history.csv"
    assert {r.group for r in read_history(grouped)} == {1, 2, 3}  # vLLM 0.12.0..0.34.0, measured in three groups


# -- verdicts through the anchor -----------------------------------------------------------------------------
def test_releases_of_different_groups_are_compared_through_the_anchor() -> None:
    """Group 2 ran under 1.5x the load of group 1: the anchor 0.26.0 shows it (150 against 100). 0.25.0 (group 2,
    165) over 0.24.0 (group 1, 100) is 1.10x through the anchor, not the 1.65x the raw figures say."""
    rows = [_row("0.23.0", 100.0), _row("0.24.0", 100.0), _row("0.26.0", 100.0),
            _row("0.25.0", 165.0, 2), _row("0.25.1", 150.0, 2), _row("0.26.0", 150.0, 2)]
    found = {(s.base, s.new): s for s in steps(rows)}
    assert list(found) == [("0.23.0", "0.24.0"), ("0.24.0", "0.25.0"), ("0.25.0", "0.25.1"), ("0.25.1", "0.26.0")]
    across = found[("0.24.0", "0.25.0")]
    assert abs(across.ratio - 1.10) < 1e-9 and across.interval == "independent through the anchor 0.26.0"
    assert across.ci_low < 1.10 < across.ci_high
    assert found[("0.25.1", "0.26.0")].ratio == pytest.approx(1.0)  # in the group they share (2), not 150/100
    assert found[("0.25.0", "0.25.1")].interval == "independent"
    # without an anchor measured in both groups nothing joins them: not comparable, never the raw ratio
    failed = [r if (r.version, r.group) != ("0.26.0", 2) else _row("0.26.0", math.nan, 2, status="failed")
              for r in rows]
    lost = {(s.base, s.new): s for s in steps(failed)}[("0.24.0", "0.25.0")]
    assert lost.verdict == "not comparable" and "the anchor 0.26.0" in lost.note


def _raw(folder, version: str, group: int, per_rep) -> None:
    doc = {"step_ns": {"caching off": [list(map(float, r)) for r in per_rep]}, "caching": {"caching off": "off"}}
    path = raw_path(folder, "vllm", version, "paper", group)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_seq_step_across_groups_is_paired_through_the_anchors_repetitions(tmp_path) -> None:
    """Each repetition's load 1x to 2x within a group (shared by its releases), group 2 at 1.4x group 1: 0.25.0 is
    5 % slower than 0.24.0; paired through the anchor's repetitions in each group the interval holds 1.05, tight."""
    rng = np.random.default_rng(7)

    def times(mean, load, shift=1.0):
        return mean * shift * load * np.exp(rng.normal(0, 0.005, size=(5, 40)))

    load1, load2 = (np.exp(rng.uniform(0, np.log(2), size=(5, 1))) for _ in range(2))
    _raw(tmp_path, "0.24.0", 1, times(100, load1))
    _raw(tmp_path, "0.26.0", 1, times(100, load1))
    _raw(tmp_path, "0.25.0", 2, times(105, load2, 1.4))
    _raw(tmp_path, "0.26.0", 2, times(100, load2, 1.4))
    rows = [_row("0.24.0", 100.0, width=0.4), _row("0.26.0", 100.0, width=0.4),
            _row("0.25.0", 147.0, 2, width=0.4), _row("0.26.0", 140.0, 2, width=0.4)]
    found = {(s.base, s.new): s for s in steps(rows, paired=paired_steps(tmp_path, rows))}
    across = found[("0.24.0", "0.25.0")]
    assert across.interval == "paired through the anchor 0.26.0"
    assert 1.0 < across.ci_low < 1.05 < across.ci_high < 1.1 and across.verdict == "slower, under the threshold"
    assert found[("0.25.0", "0.26.0")].interval == "paired"  # both in group 2
    assert (tmp_path / "runs" / "group-2" / "vllm-0.25.0__paper.json.gz").is_file()


def test_the_figure_puts_each_group_on_the_anchors_first_scale_and_lists_each_release_once() -> None:
    rows = [_row("0.24.0", 100.0), _row("0.26.0", 100.0), _row("0.25.0", 165.0, 2), _row("0.26.0", 150.0, 2)]
    scaled = {r.version: r for r in on_anchor_scale(rows)}
    assert len(on_anchor_scale(rows)) == 3 and scaled["0.25.0"].value == pytest.approx(110.0)
    assert scaled["0.25.0"].ci_low == pytest.approx(165 * 0.98 / 1.5) and scaled["0.26.0"].group == 1
    assert sorted((r.version, r.group) for r in canonical(rows)) == [("0.24.0", 1), ("0.25.0", 2), ("0.26.0", 1)]
    one_group = [_row("0.24.0", 100.0), _row("0.25.0", 120.0)]
    assert on_anchor_scale(one_group) == one_group


# -- whole runs on stand-in wheels -------------------------------------------------------------------------
LAYOUTS5 = {"0.16.0": (False, False, True), "0.22.1": (False, False, False), "0.25.0": (True, False, False),
            "0.25.1": (True, False, False), "0.26.0": (True, True, False)}


@pytest.mark.slow  # an end-to-end history of three groups on stand-in wheels, ~20 s (make test-slow, .ci/run)
def test_history_in_groups_bounded_by_the_workers_measured_memory(tmp_path, capsys, monkeypatch) -> None:
    """Groups of 3 with the anchor 0.26.0; after the first group the workers' measured peak says two fit (the bound
    forced low here), so the rest go in groups of 2: [0.16.0 0.22.1 0.26.0] [0.25.0 0.26.0] [0.25.1 0.26.0]."""
    seen = []

    def fits(peak: int, available: int) -> int:
        seen.append((peak, available))
        return 2 if peak else 1 << 30

    monkeypatch.setattr(measure, "workers_that_fit", fits)
    monkeypatch.setattr(measure, "PROGRESS_S", 0.0)  # a progress line at every position of the lockstep
    links, out = vllm_wheels(tmp_path, LAYOUTS5), tmp_path / "out"
    code = main(["history", "vllm", "0.16.0..0.26.0", "--scenario", "paper", "--reps", "2", "--group", "3",
                 "--anchor", "0.26.0", "--out", str(out), "--cache", str(tmp_path / "cache"), "--find-links",
                 str(links), *SMALL])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert [g["releases"] for g in meta["groups"]] == [["0.16.0", "0.22.1", "0.26.0"], ["0.25.0", "0.26.0"],
                                                       ["0.25.1", "0.26.0"]]
    assert meta["anchor"] == "0.26.0" and meta["group_size"] == 3
    for g in meta["groups"]:
        assert set(g["peak_rss_bytes"]) == set(g["releases"]) and min(g["peak_rss_bytes"].values()) > 10 << 20
        assert g["memory_available_bytes"] > 0
    assert seen[0][0] == 0 and all(peak >= 10 << 20 for peak, _ in seen[1:])  # bounded by what was measured
    rows = read_history(out / "history.csv")
    assert sorted({(r.version, r.group) for r in rows}) == [
        ("0.16.0", 1), ("0.22.1", 1), ("0.25.0", 2), ("0.25.1", 3), ("0.26.0", 1), ("0.26.0", 2), ("0.26.0", 3)]
    assert all(r.status == "ok" for r in rows)
    with (out / "verdicts.csv").open() as fh:
        verdicts = {(v["base"], v["new"], v["caching"], v["metric"]): v for v in csv.DictReader(fh)}
    assert verdicts[("0.22.1", "0.25.0", "off", "seq_step_ns")]["interval"] == "paired through the anchor 0.26.0"
    assert verdicts[("0.25.0", "0.25.1", "on", "alloc_ns")]["interval"] == "independent through the anchor 0.26.0"
    assert verdicts[("0.25.1", "0.26.0", "off", "seq_step_ns")]["interval"] == "paired"
    assert len(verdicts) == 4 * 2 * len(METRICS)  # 5 releases: 4 steps per series, each release once
    assert (out / "runs" / "group-3" / "vllm-0.26.0__paper.json.gz").is_file()
    assert "groups of up to 3 releases" in (out / "history.md").read_text()
    assert "group 2: 2 releases (0.25.0 to 0.26.0), the anchor 0.26.0 in every group, 1 left after it" in err
    assert "peak resident memory per worker" in err and (out / "history-vllm.png").is_file()
    assert "vllm 0.22.1 -> 0.25.0" in stdout
    assert "paper, group 1 (3 releases): repetition 2 of 2, slice 1," in err
    assert "paper, group 3 (2 releases): metered replay 2," in err


def test_the_readme_section_says_the_groups_and_the_anchor(tmp_path) -> None:
    from harness.history.readme_section import section

    write_history(tmp_path / "history.csv", [_row("0.24.0", 100.0), _row("0.26.0", 100.0), _row("0.25.0", 165.0, 2),
                                             _row("0.26.0", 150.0, 2)])
    groups = [{"releases": ["0.24.0", "0.26.0"]}, {"releases": ["0.25.0", "0.26.0"]}]
    (tmp_path / "meta.json").write_text(json.dumps({"anchor": "0.26.0", "groups": groups}))
    _, text = section(tmp_path, "results/history/vllm")
    assert "Measured in 2 groups of up to 2 releases in turn, the anchor 0.26.0 in every group" in text
    assert "0.25.0 (paper" not in text and "3 releases" in text


def test_each_row_of_the_figure_names_its_own_series(tmp_path, monkeypatch) -> None:
    """A scenario measured with caching on alone gets a legend of its own, not the first row's "caching off"."""
    rows = [replace(_row(v, 100.0, metric=m), engine="lmdeploy") for v in ("0.1.0", "0.2.0") for m in METRICS]
    rows += [replace(r, caching="on", scenario="system-prompt-256") for r in rows]
    legends = []
    monkeypatch.setattr(figure, "save_figure", lambda fig, out, name: legends.extend(
        [ax.get_title(), [t.get_text() for t in ax.get_legend().get_texts()]] for ax in fig.axes if ax.get_legend()))
    figure.draw("lmdeploy", rows, [], {}, tmp_path)
    assert legends == [["paper: seq_step_ns", ["caching off"]], ["system-prompt-256: seq_step_ns", ["caching on"]]]
