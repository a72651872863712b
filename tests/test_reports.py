"""The console summary and the tables, from rows written here: what they say, in which order, what they leave out."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.base.files import write_json
from harness.base.rows import Row, write_rows
from harness.base.text import duration_text
from harness.output.console import console_summary
from harness.output.formatting import cpu_text
from harness.output.paced_report import paced_sentence
from harness.output.readme import section
from harness.output.report import PAPER_COLUMNS, PAPER_TABLES, paper_table, scenario_summary
from harness.output.rundata import RunData

MAX_COLUMNS = 8  # a rendered table that fits a screen
META = {"complete": True, "started": "2026-12-01T10:00:00+0000", "finished": "2026-12-01T10:03:41+0000",
        "cpu_model": "Test CPU", "cpu_count": 2, "pmu": "unsupported", "git_commit": "abc123",
        "skipped_impls": {"cpp-dict": "no C++ compiler", "cpp-list": "no C++ compiler", "cpp-flat": "no C++ compiler"}}


def timed(impl: str, regime: str, ns: float, driver: str, ratio: tuple[float, float, float] | None = None,
          cpu: float | None = None, scenario: str = "paper", base: str = "flat") -> list[Row]:
    """A cell's seq-step row (with its interval and driver), its CPU share and its ratio to ``base``."""
    rows = [Row(scenario, impl, regime, "seq_step_ns", ns, "ns", "rdtsc", ci_low=ns * 0.9, ci_high=ns * 1.1,
                driver=driver),
            Row(scenario, impl, regime, "cpu_share_pct", ns / 20 if cpu is None else cpu, "%", "rdtsc", driver=driver),
            *(Row(scenario, impl, regime, metric, ns / 2, "ns", "rdtsc", ci_low=ns / 2.2, ci_high=ns / 1.8,
                  driver=driver) for metric in ("lookup_ns", "alloc_free_ns"))]
    if ratio is not None:
        value, low, high = ratio
        suffix = base.replace("-", "_")
        rows += [Row(scenario, impl, regime, f"{m}_vs_{suffix}", value, "x", "ratio", ci_low=low, ci_high=high,
                     driver=driver) for m in ("seq_step_ns", "lookup_ns", "alloc_free_ns")]
    return rows


def l1d(impl: str, regime: str, misses: float, rate: float) -> list[Row]:
    return [Row("paper", impl, regime, "l1d_miss_pct", math.nan, "%", "perf", "unsupported", "no PMU"),
            Row("paper", impl, regime, "l1d_miss_pct", rate, "%", "callgrind-sim", "ok", "simulated"),
            Row("paper", impl, regime, "l1d_misses_per_seq_step", misses, "misses", "callgrind-sim", "ok", "simulated")]


def paced(floor: tuple[float, float, float], above: tuple[float, float, float]) -> list[Row]:
    return [Row("paper", "-", "-", "paced_floor_pct", floor[0], "%", "thread_time_ns", ci_low=floor[1],
                ci_high=floor[2], reps=5, step_rate=2000.0),
            Row("paper", "flat", "batched", "cpu_share_observed_whole_step_pct", floor[0] + above[0], "%",
                "thread_time_ns", ci_low=floor[1] + above[1], ci_high=floor[2] + above[2], reps=5, step_rate=2000.0),
            Row("paper", "flat", "batched", "paced_above_floor_pct", above[0], "%", "thread_time_ns",
                ci_low=above[1], ci_high=above[2], reps=5, step_rate=2000.0)]


def make_run(tmp_path: Path, extra: list[Row] = (), meta: dict | None = None) -> RunData:
    rows = [*timed("dict", "batched", 1289.0, "python", (158.0, 141.0, 197.0)),
            *timed("flat", "batched", 8.18, "compiled"),
            *timed("flat", "per-call", 1465.0, "python"),
            *timed("vllm-v1", "per-call", 9964.0, "python", (6.8, 6.21, 7.4), cpu=382.0),
            *l1d("dict", "batched", 15.6, 0.475), *l1d("flat", "batched", 1.2, 7.14),
            Row("paper", "flat", "batched", "aa_ratio", 0.995, "x", "ratio", ci_low=0.843, ci_high=1.14),
            *extra]
    write_rows(tmp_path / "results.csv", rows)
    write_json(tmp_path / "meta.json", {**META, **(meta or {})})
    return RunData.load(tmp_path)


def _block(text: str, heading: str) -> list[str]:
    """The indented lines of the console's block whose heading line holds ``heading``."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if heading in line and not line.startswith("  "))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def test_the_console_table_keeps_its_columns_for_a_plugins_long_name(tmp_path: Path) -> None:
    text = console_summary(make_run(tmp_path, timed("toy_bm:ToyBlockManager", "batched", 2015.0, "python",
                                                    (455.0, 164.0, 543.0))))
    rows = _block(text, "ns per sequence-step")
    assert len(rows) >= 4 and len({line.index(" python ") if " python " in line else line.index(" compiled ")
                                   for line in rows[1:]}) == 1


def test_the_console_summary_says_ratio_interval_aa_driver_cores_and_where(tmp_path: Path) -> None:
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "paper_vs_article.png").write_bytes(b"png")
    (tmp_path / "paper_table.md").write_text("# table\n")
    text = console_summary(make_run(tmp_path))
    lines = text.splitlines()
    assert lines[0] == f"run: {tmp_path} (complete; took 3 min 41 s)"
    aa = next(line for line in lines if line.startswith("noise floor"))
    assert "0.995× [0.843–1.14]" in aa and "no difference" in aa
    cells = [line.split() for line in _block(text, "ns per sequence-step") if "ns/seq-step" not in line]
    assert [(c[0], c[1], c[2]) for c in cells] == [("batched", "dict", "python"), ("batched", "flat", "compiled"),
                                                   ("per-call", "flat", "python"), ("per-call", "vllm-v1", "python")]
    dict_line = next(line for line in _block(text, "ns per sequence-step") if " dict " in line)
    assert "1,289" in dict_line and "158× [141–197]" in dict_line and "64.5 %" in dict_line
    vllm_line = next(line for line in _block(text, "ns per sequence-step") if "vllm-v1" in line)
    assert "6.8× [6.21–7.4]" in vllm_line and "382 % = 3.8 cores" in vllm_line
    assert any(line.startswith("Not in this run:") and "`list`" in line and "per-call regime of `dict-jit`" not in line
               and "kvblock-bench run --scenario paper --impl list" in line for line in lines)
    assert any("`cpp-flat` (no C++ compiler)" in line for line in lines)
    assert f"reports: {tmp_path / 'paper_table.md'}" in lines
    assert any(line.startswith(f"figures: {tmp_path / 'figures'}/ (1: paper_vs_article") for line in lines)


def test_the_console_prints_the_articles_table_and_says_what_each_ratio_is_against(tmp_path: Path) -> None:
    """The README: `make bench` prints the article's table as measured here; the console's ratio column (same regime)
    and summary.md's (batched flat) are labelled apart."""
    run = make_run(tmp_path)
    text = console_summary(run)
    article = _block(text, "the article's table on `paper`, batched regime")
    assert article[0].split()[:3] == ["design", "lookup", "ns"]
    dict_row = next(line for line in article if line.startswith("  A dict"))
    assert "~134 (37×)" in dict_row and "~248 (32×)" in dict_row  # the article's figures beside ours
    assert any(line.startswith("  C flat") and "(1×)" in line for line in article)
    header = _block(text, "ns per sequence-step")[0]
    assert "× flat, same regime" in header
    assert "summary.md's × batched flat is against batched flat" in text
    assert "| × batched flat |" in scenario_summary(run)


def test_a_run_without_figures_or_an_interval_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path, meta={"complete": False})
    text = console_summary(run)
    assert "INCOMPLETE" in text.splitlines()[0]
    assert f"figures: none rendered (`kvblock-bench report {tmp_path}` renders them)" in text
    write_rows(tmp_path / "results.csv", [*timed("flat", "batched", 8.0, "")])
    text = console_summary(RunData.load(tmp_path))
    flat = next(line for line in text.splitlines() if line.startswith("  batched") and " flat " in line)
    assert "no A/A control" in text and flat.split()[2] == "—"  # no driver column in the row: said, not guessed


def tables(text: str) -> dict[str, list[list[str]]]:
    """Each ``### title`` table of a markdown text: its header and rows, as lists of cells (the rule left out)."""
    out: dict[str, list[list[str]]] = {}
    for part in text.split("\n### ")[1:]:
        title, _, body = part.partition("\n")
        out[title] = [line.split(" | ") for line in body.split("\n## ")[0].splitlines()
                      if line.startswith("| ") and "---" not in line]
    return out


def test_the_paper_table_is_split_into_tables_that_fit_a_screen(tmp_path: Path) -> None:
    """Per regime: timings, CPU share, counters; none over eight columns, every column in one of them."""
    text = paper_table(make_run(tmp_path))
    for part in text.split("\n## ")[1:]:
        found = tables(part)
        assert list(found) == [title for title, _ in PAPER_TABLES]
        assert all(len(row) <= MAX_COLUMNS for t in found.values() for row in t)
        columns = [c.strip("| ") for t in found.values() for c in t[0]]
        assert sorted(set(columns)) == sorted({"design", "impl", *PAPER_COLUMNS.values()})
        assert len(columns) == len(PAPER_COLUMNS) + 2 * len(PAPER_TABLES)  # design and impl lead each table


def test_the_committed_reference_tables_fit_a_screen() -> None:
    """The reports and the README as committed: no table over eight columns (the reports are re-rendered)."""
    root = Path(__file__).resolve().parents[1]
    for path in (root / "results" / "reference" / "paper_table.md", root / "README.md"):
        widths = [line.count(" | ") + 1 for line in path.read_text(encoding="utf-8").splitlines()
                  if line.startswith("| ")]
        assert widths and max(widths) <= MAX_COLUMNS, path


def test_the_paper_table_has_rows_only_for_cells_that_ran_and_names_the_rest(tmp_path: Path) -> None:
    text = paper_table(make_run(tmp_path))
    batched, per_call = text.split("## Batched regime")[1].split("## Per-call regime")
    assert all([row[1] for row in t[1:]] == ["`dict`", "`flat`"] for t in tables(batched).values())  # no list
    assert all([row[1] for row in t[1:]] == ["`flat`"] for t in tables(per_call).values())  # dict: batched only
    header, *body = tables(batched)["Counters"]
    columns = [c.strip("| ") for c in header]
    assert columns.index("L1D misses/seq-step") < columns.index("L1D miss %")  # the comparable figure first
    dict_row = dict(zip(columns, (c.strip("| ") for c in body[0]), strict=True))
    assert dict_row["L1D misses/seq-step"] == "15.6" and dict_row["L1D miss %"] == "0.475"
    assert dict_row["L1D source"] == "callgrind-sim (perf: unsupported)"
    assert "— (—)" not in text and "missing" not in text
    note = next(line for line in text.splitlines() if line.startswith("Not in this run:"))
    assert "per-call, step regime of `dict`" in note and "--impl dict --regime per-call,step" in note
    assert "`list`, `flat-rows`, `dict-jit`, `list-jit`" in note and "`cpp-dict` (no C++ compiler)" in note


def test_the_readme_section_leads_with_misses_and_lists_only_what_ran(tmp_path: Path) -> None:
    text = section(make_run(tmp_path))
    table = text.split("| design | lookup ns")[1].split("\n\n")[0].splitlines()[2:]
    assert [line.split(" | ")[0] for line in table] == ["| A dict", "| C flat"]
    assert "| L1D misses/seq-step | L1D miss % | article | L1D source |" in text
    assert "Not in this run:" in text


def test_the_summary_has_the_driver_and_a_ratio_to_the_scenario_base(tmp_path: Path) -> None:
    extra = [*timed("flat-pc", "batched", 40.0, "compiled", scenario="chat-multiturn"),
             *timed("dict-pc", "batched", 2000.0, "python", (50.0, 40.0, 60.0), scenario="chat-multiturn",
                    base="flat-pc"),
             Row("chat-multiturn", "dict-pc", "batched", "cache_hit_tokens_pct", 80.0, "%", "trace check")]
    text = scenario_summary(make_run(tmp_path, extra))
    caching = text.split("## chat-multiturn")[1]
    assert "× batched flat-pc |" in caching and "| `dict-pc` | batched | python |" in caching
    assert "50× [40–60]" in caching  # read from the run's paired row, not recomputed
    paper = text.split("## paper")[1].split("## chat-multiturn")[0]
    assert "| `flat` | batched | compiled |" in paper
    assert "Not in this run: per-call, step regime of `dict`" in paper  # each scenario names what it left out
    assert ("Not in this run: per-call regime of `flat-pc`, `dict-pc` (`kvblock-bench run --scenario "
            "chat-multiturn --impl flat-pc,dict-pc --regime per-call`); `radix-pc` (") in caching


@pytest.mark.parametrize(("above", "verdict"), [((0.6, 0.2, 0.95), "met"), ((2.1, 1.7, 2.6), "missed"),
                                                ((0.8, 0.5, 1.1), "not decided")])
def test_the_paced_floor_sentence_judges_the_target_on_the_interval(tmp_path: Path, above, verdict) -> None:
    run = make_run(tmp_path, paced((2.45, 1.9, 2.6), above))
    text = paced_sentence(run)
    assert "2.45 % [1.9–2.6]" in text and f"points above the floor [{above[1]:g}–{above[2]:g}]" in text
    assert f"at most 1 point above the floor, both measured in the same run: {verdict}" in text
    assert text in paper_table(run) and text in console_summary(run) and text in section(run)


@pytest.mark.parametrize(("over", "verdict"), [((0.1, -0.2, 0.2), "met"), ((0.6, 0.3, 0.9), "missed"),
                                               ((0.4, -0.1, 0.8), "not decided")])
def test_what_step_adds_to_its_kernel_is_judged_against_its_own_target(tmp_path: Path, over, verdict) -> None:
    rows = [*paced((2.45, 1.9, 2.6), (0.6, 0.2, 0.95)),
            Row("paper", "flat", "batched", "paced_step_over_kernel_pct", over[0], "%", "thread_time_ns",
                ci_low=over[1], ci_high=over[2], reps=9)]
    text = paced_sentence(make_run(tmp_path, rows))
    assert f"adds {over[0]:g} points [{over[1]:g}–{over[2]:g}] over its kernel called straight" in text
    assert f"Target: at most 0.25 points: {verdict}" in text
    assert "over its kernel" not in paced_sentence(make_run(tmp_path, paced((2.45, 1.9, 2.6), (0.6, 0.2, 0.95))))


def test_no_floor_row_no_sentence(tmp_path: Path) -> None:
    assert paced_sentence(make_run(tmp_path)) == ""


def test_cpu_share_from_one_core_up_reads_in_cores_and_durations_read_in_minutes() -> None:
    assert cpu_text(66.0) == "66 %" and cpu_text(99.9) == "99.9 %"
    assert cpu_text(382.0) == "382 % = 3.8 cores" and cpu_text(100.0) == "100 % = 1.0 cores"
    assert cpu_text(math.nan) == "—"
    assert duration_text(42.0) == "42 s" and duration_text(221.0) == "3 min 41 s"
    assert duration_text(3725.0) == "1 h 02 min" and duration_text(math.nan) == "unknown"


def test_the_machine_line_says_the_load_the_run_was_measured_under() -> None:
    from harness.output.formatting import machine_line
    from harness.run.metadata import collect

    meta = collect([])
    assert len(meta["load_average"]) == 3 and all(x >= 0 for x in meta["load_average"])
    line = machine_line({**meta, "load_average": [0.41, 0.5, 0.6], "load_average_end": [2.9, 1.0, 1.0]})
    assert line.endswith("; load average 0.41 at the start, 2.9 at the end")
    assert "load average" not in machine_line({"cpu_model": "x"})  # runs from before it was recorded
