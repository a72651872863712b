"""Figures and notebooks against the committed sample run (``results/sample/``), so that neither rots."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from harness.output import plots
from harness.output.results import Row, read_rows, write_rows
from harness.studies import idwidth

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "results" / "sample"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# Every figure the sample run is made to feed (see results/sample/README.md).
SAMPLE_FIGURES = set(plots.FIGURES)


@pytest.fixture
def sample_run(tmp_path: Path) -> Path:
    """A writable copy of the sample run (rendering writes figures/ into the run directory)."""
    return Path(shutil.copytree(SAMPLE, tmp_path / "sample"))


def _stems(paths: list[Path]) -> set[str]:
    return {p.stem for p in paths}


def test_sample_run_renders_every_figure(sample_run: Path) -> None:
    written = plots.render_figures(sample_run)
    assert _stems(written) == SAMPLE_FIGURES
    for stem in SAMPLE_FIGURES:
        for ext in ("png", "svg"):
            path = sample_run / "figures" / f"{stem}.{ext}"
            assert path in written and path.stat().st_size > 1000, path
    assert not list((sample_run / "figures").glob(".*.tmp")), "temporary files left behind"
    assert (sample_run / "figures" / "op_latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (sample_run / "figures" / "op_latency.svg").read_text()
    assert "<svg" in svg and "commit" in svg  # the footer names the commit


def test_partial_run_renders_what_it_can(sample_run: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No raw samples, no sweep, no paced runs, no id-width rows: the rest still renders, the rest is noted."""
    shutil.rmtree(sample_run / "raw")
    dropped = {"cpu_share_observed_pct", "idwidth_lookup_ns", "step_p99_ns", "nrt_allocs_per_step"}
    rows = [r for r in read_rows(sample_run / "results.csv")
            if r.metric not in dropped and not r.scenario.startswith("concurrency-")]
    write_rows(sample_run / "results.csv", rows)
    written = plots.render_figures(sample_run)
    assert {"op_latency", "cpu_share_rate", "allocs_per_step", "paper_vs_article"} <= _stems(written)
    assert not {"step_cdf", "cpu_share_concurrency", "idwidth"} & _stems(written)
    notes = caplog.text
    assert "step_cdf" in notes and "cpu_share_concurrency" in notes and "idwidth" in notes
    assert "failed" not in notes


def test_unsupported_and_nan_rows_are_words_not_numbers(sample_run: Path) -> None:
    """Non-ok rows (L1D without a PMU, a failed figure) render as annotations; nothing crashes on NaN."""
    rows = [r for r in read_rows(sample_run / "results.csv")
            if not (r.scenario == "paper" and r.metric == "l1d_miss_pct" and r.impl in ("dict", "list", "flat"))]
    for impl in ("dict", "list", "flat"):
        rows.append(Row("paper", impl, "batched", "l1d_miss_pct", math.nan, "%", "unavailable", "unsupported",
                        "perf reports <not supported>"))
        rows.append(Row("paper", impl, "per-call", "l1d_miss_pct", 1.5, "%", "callgrind-sim", "ok", "simulated"))
    rows = [Row(r.scenario, r.impl, r.regime, r.metric, math.nan, r.unit, r.source, "failed", r.how)
            if (r.impl, r.metric) == ("list", "lookup_ns") else r for r in rows]
    write_rows(sample_run / "results.csv", rows)
    run = plots.RunData.load(sample_run)
    fig = plots.fig_l1d(run)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("unsupported (no PMU)" in t for t in texts)
    assert any("callgrind-sim" in t for t in texts)
    assert {p.suffix for p in plots.save_figure(fig, sample_run / "figures", "l1d_miss")} == {".png", ".svg"}
    fig = plots.fig_op_latency(run)
    assert any(t.get_text() == "failed" for ax in fig.axes for t in ax.texts)


def test_a_run_with_nothing_to_plot_renders_nothing(tmp_path: Path) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    write_rows(run / "results.csv", [Row("paper", "-", "-", "trace_s", 0.1, "s", "wall clock")])
    assert plots.render_figures(run) == []


def test_idwidth_rows_agree_across_widths() -> None:
    """Small and fast: the paper state only, few calls. Every width computes the design's own slots
    (checked inside measure); here: the rows' shape and the byte figures."""
    rows = idwidth.idwidth_rows(large_seqs=0, runs=2)
    by = {(r.regime, r.metric): r for r in rows}
    assert {r.regime for r in rows} == {"uint16/paper", "int32/paper", "int64/paper"}
    for dtype, size in (("uint16", 2), ("int32", 4), ("int64", 8)):
        assert by[(f"{dtype}/paper", "table_bytes_per_seq")].value == size * 256
        assert by[(f"{dtype}/paper", "idwidth_table_bytes")].value == size * 256 * 256
        lookup = by[(f"{dtype}/paper", "idwidth_lookup_ns")]
        assert lookup.status == "ok" and 0 < lookup.value < 1e4 and lookup.unit == "ns"
    assert all(r.scenario == "paper" and r.impl == "flat" for r in rows)


def test_idwidth_kernel_matches_flat_lookup() -> None:
    mgr, seq_ids = idwidth.paper_state(steps=20)
    want = np.zeros(seq_ids.shape[0], dtype=np.int64)
    mgr.lookup(seq_ids, want)
    lens = np.ascontiguousarray(mgr._lens, dtype=np.int32)
    for dtype in idwidth.DTYPES:
        got = np.zeros_like(want)
        idwidth._lookup_loop(mgr.table.astype(dtype), lens, seq_ids, mgr.block_shift, 3, got)
        assert np.array_equal(got, want), dtype


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebooks_have_no_outputs(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs"


def test_both_notebooks_exist() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"paper_table.ipynb", "explore.ipynb"}


@pytest.fixture
def this_python_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec running this interpreter, first on JUPYTER_PATH: a user's own ``python3`` kernel (another
    Python, without this project's dependencies) must not be the one that runs the notebooks."""
    spec = tmp_path / "jupyter" / "kernels" / "kvb-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kvblock-bench tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "kvb-test"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_against_the_sample(path: Path, sample_run: Path, this_python_kernel: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient import NotebookClient

    monkeypatch.setenv("KVB_RUN", str(sample_run))
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, timeout=120, kernel_name=this_python_kernel,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code" for o in c.outputs)
    assert str(sample_run) in text  # it read the run it was pointed at, not results/latest
    # the notebooks only read: executing them wrote nothing into the run
    assert not (sample_run / "figures").exists()
