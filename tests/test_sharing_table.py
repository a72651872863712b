"""The headline's second table: every design on a scenario with forks and copy-on-write, generated from rows."""

from __future__ import annotations

from pathlib import Path

from harness.base.files import write_json
from harness.base.rows import Row, write_rows
from harness.output.readme import section
from harness.output.report import sharing_table
from harness.output.rundata import RunData
from harness.run.runner import trace_count_rows
from scenarios import generate


def run_of(tmp_path: Path, rows: list[Row]) -> RunData:
    write_rows(tmp_path / "results.csv", rows)
    write_json(tmp_path / "meta.json", {"complete": True})
    return RunData.load(tmp_path)


def cell(scenario: str, impl: str, regime: str, ns: float) -> list[Row]:
    return [Row(scenario, impl, regime, "seq_step_ns", ns, "ns", "rdtsc", ci_low=ns * 0.9, ci_high=ns * 1.1),
            Row(scenario, impl, regime, "allocs_per_step", 0.0, "allocs/step", "memray")]


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def test_the_table_has_a_row_per_design_and_regime_in_registry_order(tmp_path: Path) -> None:
    s = "parallel-sampling"
    rows = [*cell(s, "list", "batched", 900.0), *cell(s, "flat", "batched", 9.0), *cell(s, "flat", "per-call", 2e3),
            *cell(s, "dict-jit", "batched", 200.0), *cell(s, "vllm-v1", "per-call", 5e3),  # not a design: left out
            *cell("paper", "dict", "batched", 1e3),  # another scenario: left out
            Row(s, "-", "-", "trace_forks", 12, "forks", "trace header"),
            Row(s, "-", "-", "trace_cows", 345, "copy-on-writes", "trace header")]
    text = sharing_table(run_of(tmp_path, rows))
    assert "# Copy-on-write: every design on `parallel-sampling`" in text
    assert "12 forks and 345 copy-on-writes" in text
    header, *body = table_lines(text)
    assert header.startswith("| design | impl | regime | ns/seq-step |")
    assert [line.split(" | ")[1:3] for line in body] == [["`list`", "batched"], ["`flat`", "batched"],
                                                         ["`flat`", "per-call"], ["`dict-jit`", "batched"]]
    assert all(line.count(" | ") == header.count(" | ") for line in body)
    assert "900 [810–990]" in body[0] and "(1×)" in body[1]


def test_another_sharing_scenario_stands_in_and_missing_counts_are_said(tmp_path: Path) -> None:
    text = sharing_table(run_of(tmp_path, [*cell("shared-prefix", "flat", "batched", 9.0)]))
    assert "every design on `shared-prefix`" in text and "how many is not in this run's rows" in text
    assert len(table_lines(text)) == 2


def test_a_run_without_sharing_gets_a_note_not_a_crash(tmp_path: Path) -> None:
    run = run_of(tmp_path, [*cell("paper", "flat", "batched", 9.0)])
    text = sharing_table(run)
    assert text.startswith("# Copy-on-write: not in this run") and not table_lines(text)
    assert "so no design is shown with sharing" in section(run)


def test_the_readme_section_carries_the_batched_table(tmp_path: Path) -> None:
    s = "parallel-sampling"
    run = run_of(tmp_path, [*cell(s, "flat", "batched", 9.0), *cell(s, "flat", "per-call", 2e3),
                            *cell("paper", "flat", "batched", 8.0)])
    text = section(run)
    assert "`parallel-sampling` does" in text
    flat = [line for line in table_lines(text.split("Copy-on-write:")[1]) if "| `flat` |" in line]
    assert len(flat) == 1 and "| batched |" in flat[0]


def test_the_trace_counts_are_rows_of_their_own() -> None:
    trace = generate("parallel-sampling", steps=20, running=16, num_blocks=1024)
    rows = {r.metric: r for r in trace_count_rows("ps", trace)}
    assert rows["trace_forks"].value == trace.header["ops_by_kind"]["fork"] > 0
    assert rows["trace_cows"].value == trace.header["cow_count"] == int(trace.step_cows.sum())
    assert {(r.impl, r.regime) for r in rows.values()} == {("-", "-")}
