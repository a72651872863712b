"""Nothing silently replaced or invented (issue 57, item 5), and one line for every flag that names a file or a
class (item 4): compare's doubtful rows, report's folders without rows or metadata, history's folder, the gate's
rules that cannot fail, a cell missing from the gate's baseline, Markdown from a run's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.gate import saved as gate_baseline
from harness.output.compare import Rules, compare_runs, load_run
from harness.output.compare_report import render_markdown, render_text
from tests.test_compare import make_run, three


def one_line(capsys, status: int, *words: str) -> str:
    out, err = capsys.readouterr()
    assert status == 2, (status, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvblock-bench: error: ") and "Traceback" not in out + err, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- compare --------------------------------------------------------------------------------------------------
def edited(tmp_path: Path, change) -> tuple[Path, Path]:
    """BASE and a NEW whose batched flat seq_step_ns row ``change`` rewrote (as a CSV line's fields)."""
    base = make_run(tmp_path / "base", three())
    new = make_run(tmp_path / "new", three())
    lines = []
    for line in (new / "results.csv").read_text().splitlines(keepends=True):
        fields = line.rstrip("\r\n").split(",")
        lines += [",".join(f) + "\r\n" for f in change(fields)] if line.startswith("paper,flat,batched,seq_step_ns,") \
            else [line]
    (new / "results.csv").write_text("".join(lines))
    return base, new


VALUE, SOURCE, STATUS, LOW, HIGH = 4, 6, 7, 13, 14  # results.csv's columns by position


def put(fields: list[str], **at: object) -> list[str]:
    """``fields`` with the columns named (VALUE, LOW, ... in lower case) set."""
    out = list(fields)
    for name, value in at.items():
        out[globals()[name.upper()]] = str(value)
    return out


LOST = {  # NEW's row, as edited -> what the comparison says of it
    "no interval": (lambda f: [put(f, low="", high="")], "no interval in NEW"),
    "value zeroed": (lambda f: [put(f, value=0.0)], "not a positive figure"),
    "value ten times below its interval": (lambda f: [put(f, value=float(f[VALUE]) / 10)],
                                           "lies outside its own interval"),
    "value above its interval": (lambda f: [put(f, value=float(f[HIGH]) * 1.5)], "lies outside its own interval"),
    "no longer measured": (lambda f: [put(f, value="", status="unavailable")], "unavailable in NEW"),
}


@pytest.mark.parametrize("case", LOST)
def test_a_row_that_lost_its_value_or_interval_is_a_lost_figure(case: str, tmp_path: Path, capsys) -> None:
    """Exit 1 naming the figure (NEW lost it), 0 only with --allow-lost; never "not comparable" and a pass."""
    change, words = LOST[case]
    base, new = edited(tmp_path, change)
    assert main(["compare", str(base), str(new)]) == 1
    out = capsys.readouterr().out
    assert "NEW lost figures BASE has: flat (batched seq_step_ns: " in out and words in out, out
    assert main(["compare", str(base), str(new), "--allow-lost"]) == 0


@pytest.mark.parametrize(("change", "words"), [
    (lambda f: [f, put(f, value=float(f[VALUE]) / 3, source="other-clock", low=float(f[LOW]) / 3,
                       high=float(f[HIGH]) / 3)], "more than once"),
    (lambda f: [put(f, low=f[HIGH], high=f[LOW])], "low"),
])
def test_a_figure_twice_or_an_interval_upside_down_is_refused(change, words: str, tmp_path: Path, capsys) -> None:
    base, new = edited(tmp_path, change)
    one_line(capsys, main(["compare", str(base), str(new)]), str(new / "results.csv"), words)


def test_a_base_value_outside_its_interval_compares_nothing_and_loses_nothing(tmp_path: Path) -> None:
    base, new = edited(tmp_path, LOST["value ten times below its interval"][0])
    c = compare_runs(load_run("BASE", new, tmp_path), load_run("NEW", base, tmp_path))
    (row,) = [r for r in c.rows if (r.impl, r.metric) == ("flat", "seq_step_ns")]
    assert row.verdict == "not comparable" and "outside its own interval" in row.why and row.why.endswith("in BASE")
    assert not row.lost


def test_markdown_and_text_carry_a_runs_strings_as_text_only(tmp_path: Path) -> None:
    """A commit, a CPU name and an implementation name holding newlines and Markdown add no heading, link, list,
    table row or HTML to the comment, and no line to the text report."""
    hostile = "abc\n### injected\n- [click](http://x) <img src=x> | cell |"
    base = make_run(tmp_path / "base", [*three(), *three(impl="a`b|c")], meta={"git_commit": hostile})
    new = make_run(tmp_path / "new", [*three(scale=1.5), *three(impl="a`b|c")],
                   meta={"git_commit": hostile, "started": "x\n\n# head"})
    c = compare_runs(load_run("BASE", base, tmp_path), load_run("NEW", new, tmp_path), rules=Rules())
    md, text = render_markdown(c), render_text(c)
    for line in md.splitlines():
        assert not line.startswith(("### injected", "# head", "- [", "<img")), line
    assert "](http" not in md.replace("\\](http", "") and "<img" not in md.replace("\\<img", "")
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert all(line.count(" | ") == rows[0].count(" | ") for line in rows)  # no extra cells
    assert not any(line.startswith(("### injected", "# head")) for line in text.splitlines())


# -- report -------------------------------------------------------------------------------------------------
@pytest.fixture
def reported(tmp_path: Path) -> Path:
    """A run folder with its saved reports."""
    run = make_run(tmp_path / "run", three())
    for name in ("paper_table.md", "summary.md"):
        (run / name).write_text(f"saved {name}\n")
    return run


def _saved(run: Path) -> dict[str, str]:
    return {name: (run / name).read_text() for name in ("paper_table.md", "summary.md")}


@pytest.mark.parametrize("case", ["header only", "no meta.json", "meta.json a list", "meta.json a string",
                                  "meta.json null"])
def test_report_refuses_a_folder_it_would_report_with_invented_figures(case: str, reported: Path, capsys) -> None:
    before = _saved(reported)
    if case == "header only":
        text = (reported / "results.csv").read_text()
        (reported / "results.csv").write_text(text.splitlines(keepends=True)[0])
    elif case == "no meta.json":
        (reported / "meta.json").unlink()
    else:
        (reported / "meta.json").write_text({"meta.json a list": "[1, 2]", "meta.json a string": '"x"',
                                              "meta.json null": "null"}[case])
    one_line(capsys, main(["report", str(reported), "--no-figures"]), str(reported))
    assert _saved(reported) == before


@pytest.mark.parametrize("flag", ["--readme", "--growth-readme"])
@pytest.mark.parametrize("content", [b"# a README without the markers\n", b"", b"\xff\xfe not UTF-8"])
def test_report_refuses_a_readme_it_cannot_rewrite_before_writing_anything(flag: str, content: bytes,
                                                                           reported: Path, tmp_path: Path,
                                                                           capsys) -> None:
    readme = tmp_path / "README.md"
    readme.write_bytes(content)
    before = _saved(reported)
    one_line(capsys, main(["report", str(reported), "--no-figures", flag, str(readme)]), flag, str(readme))
    assert readme.read_bytes() == content and _saved(reported) == before


def history_folder(tmp: Path) -> Path:
    """A history folder of three vllm releases: 0.2.0 is 6 % slower than 0.1.0 (each figure within ±0.5 %), 0.3.0
    as 0.2.0."""
    from harness.history.records import HISTORY_CSV, HistoryRow, write_history

    folder = tmp / "results" / "history" / "vllm"
    folder.mkdir(parents=True)
    write_history(folder / HISTORY_CSV, [
        HistoryRow("vllm", version, "off", "paper", "seq_step_ns", value, value * 0.995, value * 1.005, "ok", 5, 100,
                   "sha256:x", "m", "1.0", "t", "kvblock-bench history vllm 0.1.0..0.3.0", "")
        for version, value in (("0.1.0", 100.0), ("0.2.0", 106.0), ("0.3.0", 106.0))])
    (folder / "meta.json").write_text(json.dumps({"command": "kvblock-bench history vllm 0.1.0..0.3.0",
                                                  "machine": "m", "load_average_by_scenario": {"paper": [0.5, 1.5]}}))
    return folder


def test_history_shows_a_measured_change_under_the_threshold_as_one(tmp_path: Path) -> None:
    """1.06 [1.05-1.07] at the 10 % threshold: "slower <10 %" in the table, the console and verdicts.csv, never "="
    or "no difference"; 0.2.0 -> 0.3.0 (an interval holding 1) stays "="."""
    import csv

    from harness.history.render import render

    folder = history_folder(tmp_path)
    lines = render(folder, figures=False)
    (moved,) = [line for line in (folder / "history.md").read_text().splitlines() if "0.1.0 -> 0.2.0" in line]
    assert "1.06 [1.05-1.07] slower <10 %" in moved and " = " not in moved, moved
    assert any("0.1.0 -> 0.2.0" in line and "slower <10 %" in line for line in lines)
    with (folder / "verdicts.csv").open() as fh:
        verdicts = {(v["base"], v["new"]): v["verdict"] for v in csv.DictReader(fh)}
    assert verdicts == {("0.1.0", "0.2.0"): "slower, under the threshold", ("0.2.0", "0.3.0"): "no difference"}


def test_history_readme_without_its_markers_is_one_line(tmp_path: Path, capsys) -> None:
    folder = history_folder(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    one_line(capsys, main(["report", str(folder), "--history-readme", str(readme)]), "--history-readme",
             "history-vllm:begin")


# -- history --out ----------------------------------------------------------------------------------------------
def test_history_out_over_an_existing_history_is_refused_before_anything_is_fetched(tmp_path: Path,
                                                                                   capsys) -> None:
    out = tmp_path / "h"
    out.mkdir()
    (out / "history.csv").write_text("engine,version\nvllm,0.1.0\n")
    status = main(["history", "vllm", "0.1.0,0.2.0", "--out", str(out), "--find-links", str(tmp_path)])
    one_line(capsys, status, "--out", "holds a history already")
    assert (out / "history.csv").read_text() == "engine,version\nvllm,0.1.0\n"


# -- the gate's rules and baseline -------------------------------------------------------------------------------
RULE = '[[tool.kvblock-bench.gate.rule]]\nimpl = "{impl}"\nregime = "{regime}"\n'
IDLE = {  # a rule that can never fail -> words of the refusal
    'wall = {slower = "dict", faster = "flat", min_ratio = 0}': "min_ratio = 0",
    'wall = {slower = "flat", faster = "flat", min_ratio = 3}': "both 'flat'",
    RULE.format(impl="flat", regime="batched") + "max_instructions_per_seq_step = 0\n": "= 0",
    RULE.format(impl="dict", regime="batched") + "min_instructions_vs_base = 0\n": "min_instructions_vs_base = 0",
    RULE.format(impl="dict", regime="step") + "zero_allocations = true\n": "regime 'step'",
    RULE.format(impl="cpp-flat", regime="per-call") + "max_instructions_vs_base = 1.02\n": "batched only",
    RULE.format(impl="flat", regime="batched") + "max_instructions_vs_base = 2\n": "flat batched itself",
}


@pytest.mark.parametrize("rule", IDLE)
def test_the_gate_refuses_a_rule_that_cannot_fail(rule: str, tmp_path: Path, capsys) -> None:
    config = tmp_path / "gate.toml"
    head = "[tool.kvblock-bench.gate]\n"
    config.write_text(head + rule if rule.startswith("wall") else head + "\n" + rule)
    one_line(capsys, main(["gate", "--config", str(config), "--no-callgrind"]), str(config), IDLE[rule])


def test_a_cell_the_gate_baseline_lacks_fails_instead_of_passing() -> None:
    cell = {"impl": "flat", "regime": "batched", "instructions": [100], "seq_steps": 10, "memray_per_step": 0,
            "nrt_per_step": 0}
    baseline = {"cells": [cell], "commit": "abc"}
    current = {"cells": [cell, {**cell, "impl": "mine"}]}
    failures, _ = gate_baseline.against(baseline, current, 1.0)
    assert failures and "mine batched: not in the baseline" in failures[0]


def test_a_history_json_meta_with_markdown_stays_text(tmp_path: Path) -> None:
    from harness.history.render import render

    folder = history_folder(tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "command": "x`\n# injected", "machine": "m\n- [a](b)"}))
    render(folder, figures=False)
    text = (folder / "history.md").read_text()
    assert not any(line.startswith(("# injected", "- [a]")) for line in text.splitlines())

