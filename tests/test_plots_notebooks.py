"""Figures and notebooks against the committed sample run (``results/sample/``), so that neither rots."""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import nbformat
import numpy as np
import pytest

from harness.base.rows import Row, read_rows, write_rows
from harness.output import growth, plots
from harness.output.drawing import MAX_SERIES, label
from harness.output.formatting import fmt
from harness.studies import idwidth
from impls import registry
from tests.test_compare import make_run

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


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
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


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_partial_run_renders_what_it_can(sample_run: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No raw samples, no sweep, no paced runs, no id-width rows: the rest still renders, the rest is noted."""
    shutil.rmtree(sample_run / "raw")
    dropped = {"cpu_share_observed_pct", "idwidth_lookup_ns", "step_p99_ns", "nrt_allocs_per_step"}
    rows = [r for r in read_rows(sample_run / "results.csv")
            if r.metric not in dropped and not r.scenario.startswith("concurrency-")]
    write_rows(sample_run / "results.csv", rows)
    written = plots.render_figures(sample_run)
    assert {"op_latency", "cpu_share_paced", "allocs_per_step", "paper_vs_article"} <= _stems(written)
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
    run = make_run(tmp_path / "empty", [Row("paper", "-", "-", "trace_s", 0.1, "s", "wall clock")])
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


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
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


# -- how the figures read (structure, not pixels) -----------------------------------------------------------
REFERENCE = REPO / "results" / "reference"


@pytest.fixture(scope="module")
def reference() -> plots.RunData:
    return plots.RunData.load(REFERENCE)


def _texts(ax) -> list:
    return [t for t in ax.texts if t.get_visible() and t.get_text().strip()]


def _ratio_text(row: dict) -> str:
    """A paired ratio row as the figures print it: ``R× [low–high]``."""
    return f"{fmt(float(row['value']))}× [{fmt(float(row['ci_low']))}–{fmt(float(row['ci_high']))}]"


def test_the_headline_figure_has_one_row_per_regime_and_every_bar_its_ratio(reference) -> None:
    fig = plots.fig_paper_vs_article(reference)
    rows = fig.subfigs
    assert [sub._suptitle.get_text().split(":")[0] for sub in rows] == ["Batched regime", "Per-call regime"]
    for sub in rows:
        titles = [ax.get_title() for ax in sub.axes]
        assert titles == ["lookup", "alloc/free", "CPU share at 2,000 steps/s (computed)",
                          "L1D misses per sequence-step (callgrind-sim)"]  # no PMU here: no rate panel
    batched_lookup = rows[0].axes[0]
    labels = [t.get_text() for t in _texts(batched_lookup)]
    dict_ratio = reference.get("paper", "dict", "batched", "lookup_ns_vs_flat")  # value, paired ratio, interval
    assert any(t.startswith(f"{fmt(reference.value('paper', 'dict', 'batched', 'lookup_ns'))}  "
                            f"{_ratio_text(dict_ratio)}") for t in labels)
    assert any(t.endswith("1× (base)") for t in labels) and any(t.startswith("~134") for t in labels)
    cpp_ratio = reference.get("paper", "cpp-flat", "batched", "lookup_ns_vs_flat")
    assert any(_ratio_text(cpp_ratio) in t for t in labels)  # cpp-flat beside, batched row only
    assert not any(_ratio_text(cpp_ratio) in t.get_text() for t in _texts(rows[1].axes[0]))
    assert all(t.get_rotation() == 0 and t.get_fontsize() >= 7.5 for ax in fig.axes for t in _texts(ax))
    l1d = [t.get_text() for t in _texts(rows[0].axes[3])]
    dict_misses = fmt(reference.value("paper", "dict", "batched", "l1d_misses_per_seq_step"))
    assert dict_misses in l1d  # misses per sequence-step; the one instrument is in the panel's title
    assert "drawn only where a PMU measures it" in " ".join(t.get_text() for t in fig.texts)


def test_no_label_overlaps_another_in_the_headline_figure(reference) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots.fig_paper_vs_article(reference)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in _texts(ax)]
        clashes = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
        assert not clashes, f"{ax.get_title()}: {len(clashes)} overlapping labels"


def test_a_pmu_rate_is_drawn_beside_the_article_only_where_perf_measured_it(sample_run: Path) -> None:
    rows = [r for r in read_rows(sample_run / "results.csv") if r.metric != "l1d_miss_pct"]
    rows += [Row("paper", impl, "batched", "l1d_miss_pct", rate, "%", "perf") for impl, rate in
             (("dict", 0.5), ("list", 0.4), ("flat", 6.0))]
    write_rows(sample_run / "results.csv", rows)
    fig = plots.fig_paper_vs_article(plots.RunData.load(sample_run))
    batched = fig.subfigs[0].axes
    assert batched[-1].get_title() == "L1D miss rate (perf, hardware counters)"
    assert {t.get_text().strip() for t in _texts(batched[-1])} >= {"0.5 %", "6 %", "~14.8", "~3.9", "~0.4"}


def _series_labels(ax) -> list[str]:
    known = {label(name) for name in registry.names()}
    legend = ax.get_legend()
    texts = [t.get_text().split(",")[0] for t in legend.get_texts()] if legend else []  # "A dict, batched"
    return [t for t in texts if t in known]


@pytest.mark.parametrize("stem", ["op_latency", "step_cdf", "cpu_share_paced", "cpu_share_concurrency", "prefix_cache"])
def test_at_most_eight_series_per_axes(reference, stem: str) -> None:
    fig = plots.FIGURES[stem](reference)
    counts = [len(_series_labels(ax)) for ax in fig.axes]
    assert max(counts) <= MAX_SERIES and sum(counts) >= 4, counts


# -- a quick run's figures and a full run's ---------------------------------------------------------------
L1D_INSTRUMENTS = ("l1d_miss_pct", "l1d_misses_per_seq_step", "instructions_per_seq_step")


def quick_shaped(run_dir: Path) -> Path:
    """``run_dir`` (a full run) rewritten as ``--quick`` writes a run: callgrind skipped (its rows ``skipped``),
    and ``concurrency-256``, whose quick trace is ``paper``'s, holding every ``paper`` row (the runner's rule
    for a trace met twice: ``harness.run.runner``)."""
    from harness.run.runner import TRACE_METRICS

    rows = []
    for r in read_rows(run_dir / "results.csv"):
        if r.metric in L1D_INSTRUMENTS and r.source.startswith("callgrind"):
            if r.metric == "l1d_miss_pct":
                rows.append(Row(r.scenario, r.impl, r.regime, r.metric, math.nan, "%", "callgrind-sim", "skipped",
                                "not run with --quick"))
        elif not (r.scenario == "concurrency-256" and r.metric not in TRACE_METRICS):
            rows.append(r)
    rows += [replace(r, scenario="concurrency-256") for r in rows
             if r.scenario == "paper" and r.metric not in TRACE_METRICS]
    write_rows(run_dir / "results.csv", rows)
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["config"]["quick"] = "True"
    (run_dir / "meta.json").write_text(json.dumps(meta))
    return run_dir


@pytest.fixture(scope="module")
def quick_reference(tmp_path_factory: pytest.TempPathFactory) -> plots.RunData:
    run_dir = tmp_path_factory.mktemp("quick") / "quick"
    shutil.copytree(REFERENCE, run_dir, ignore=shutil.ignore_patterns("figures"))
    return plots.RunData.load(quick_shaped(run_dir))


def _series_count(ax) -> int:
    """Series an axes asks a reader to tell apart: its lines with error bars, or the implementations its legend
    names (bars grouped under ticks that name their implementation are read by the tick, not counted)."""
    from matplotlib.container import ErrorbarContainer

    return max(sum(isinstance(c, ErrorbarContainer) for c in ax.containers), len(_series_labels(ax)))


def _every_figure(run: plots.RunData) -> dict:
    figures = {stem: make(run) for stem, make in plots.FIGURES.items()}
    figures["growth"] = growth.fig_growth(run, growth.slopes(run))
    return figures


@pytest.mark.parametrize("shape", ["full", "quick"])
def test_every_figure_of_a_full_and_a_quick_run_has_at_most_eight_series_per_axes(
        reference, quick_reference, shape: str) -> None:
    figures = _every_figure(reference if shape == "full" else quick_reference)
    assert all(fig is not None for fig in figures.values()), [s for s, f in figures.items() if f is None]
    counts = {stem: [_series_count(ax) for ax in fig.axes] for stem, fig in figures.items()}
    assert all(max(c) <= MAX_SERIES for c in counts.values()), counts
    assert sum(counts["growth"]) >= 10 and sum(counts["cpu_share_paced"]) >= 4, counts


def test_sweep_figures_draw_only_cells_measured_at_two_sizes(quick_reference) -> None:
    """A quick run's concurrency-256 is paper's trace and holds paper's cells (engines, per-call, step): a cell
    with one size has no growth, is not drawn, and the caption counts it."""
    fig = plots.fig_cpu_concurrency(quick_reference)
    names = {name for ax in fig.axes for name in _series_labels(ax)}
    assert label("flat") in names and label("vllm-v1") not in names
    assert "at concurrency-256 only" in " ".join(t.get_text() for t in fig.texts)
    panels, alone = growth.growth_panels(quick_reference)
    drawn = {key for _, _, _, data in panels for key, pts in data.items() if len(pts) >= 2}
    assert all(len(pts) >= 2 for _, _, _, data in panels for pts in data.values())
    assert ("flat", "batched") in drawn and not any(impl == "vllm-v1" for impl, _ in drawn)
    assert alone and {scenario for _, _, scenario in alone} == {"concurrency-256"}
    assert any(name == "vllm-v1" for _, name, _ in alone)
    fig = growth.fig_growth(quick_reference, growth.slopes(quick_reference))
    assert f"{len(alone)} at concurrency-256 only (concurrency)" in " ".join(t.get_text() for t in fig.texts)


def test_l1d_bars_of_a_quick_run_say_each_instruments_reason(quick_reference, reference) -> None:
    """No PMU and callgrind skipped by --quick: one panel of the article's rates says both reasons once, from the
    rows' status and source; a full run names its one instrument in each panel's title, not on every bar."""
    def bar_words(run: plots.RunData) -> list[str]:  # what stands on or over each bar, the article's left out
        return [t.get_text() for ax in plots.fig_l1d(run).axes for t in _texts(ax)
                if t.get_rotation() == 90 and not t.get_text().startswith(" ~")]

    assert bar_words(quick_reference) == []  # one reason for every cell: said once, not per bar
    quick = plots.fig_l1d(quick_reference)
    assert len(quick.axes) == 1  # no empty panel of misses per sequence-step
    notes = [t.get_text() for ax in quick.axes for t in _texts(ax)]
    assert notes.count("not measured in this run:\nperf: no PMU; callgrind-sim: not run (--quick)") == 1
    full = plots.fig_l1d(reference)
    words = bar_words(reference)
    assert len(words) == 2 * len(reference.cells("paper", "l1d_miss_pct"))
    assert not any("callgrind-sim" in w for w in words)
    assert all(ax.get_title().endswith("every bar: callgrind-sim: simulated caches") for ax in full.axes)


def test_paced_shares_are_drawn_against_their_own_cells_computed_share(reference) -> None:
    points, unpaired = plots.paced_points(reference)
    observed = reference.df[(reference.df.scenario == "paper") & (reference.df.status == "ok")
                            & reference.df.metric.isin(list(plots.PACED_KINDS))]
    assert len(points) == len(observed) and unpaired == 0
    for p in points:
        assert p.x == reference.value("paper", p.impl, p.regime, "cpu_share_pct")  # same rate: no scaling
        assert p.y == reference.value("paper", p.impl, p.regime, p.metric) and p.y_ci is not None
    fig = plots.fig_cpu_paced(reference)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_xscale() == ax.get_yscale() == "log" and ax.get_xlim() == ax.get_ylim()
    floor = reference.value("paper", "-", "-", "paced_floor_pct")
    assert any(list(line.get_ydata()) == [floor, floor] for line in ax.get_lines())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "observed = computed" in labels and "paced decode calls, step cell" in labels


def test_prefix_caching_is_a_panel_per_regime_of_ratios_to_flat_pc(reference) -> None:
    """One panel per regime, so that no panel holds more than one series per design (at most eight series)."""
    fig = plots.fig_prefix_cache(reference)
    axes = [a for a in fig.axes if a.get_visible()]
    assert [a.get_title() for a in axes] == ["batched regime", "per-call regime"]
    labels = set()
    for ax in axes:
        assert "flat-pc" in ax.get_ylabel() and ax.get_yscale() == "log"
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert [t.split("\n")[0] for t in ticks] == ["mooncake-cached", "chat-multiturn", "tight-pool-cached",
                                                     "system-prompt-256", "system-prompt-1024"]
        assert all("hit " in t and "flat-pc:" in t for t in ticks)
        labels |= {t.get_text() for t in _texts(ax)}
    ratios = {f"{fmt(reference.value(scenario, impl, 'batched', 'seq_step_ns_vs_flat_pc'))}×"
              for scenario, impl in (("mooncake-cached", "dict-pc"), ("system-prompt-256", "vllm-v1-pc"))}
    assert {*ratios, "1× (base)"} <= labels  # the run's paired ratios, read from its rows


def _lab(hex_colour: str) -> np.ndarray:
    """CIELAB of an sRGB colour (D65), lightness halved: distinct hues matter more than light and dark."""
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([(116 * f[1] - 16) / 2, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_every_implementation_has_a_colour_of_its_own() -> None:
    colours = {rec.name: rec.color for rec in registry.RECORDS}
    names = list(colours)
    close = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
             if np.linalg.norm(_lab(colours[a]) - _lab(colours[b])) < 20]
    assert not close, f"colours too alike: {close}"


# -- which run a notebook reads --------------------------------------------------------------------------------
def _run_folder(results: Path, name: str, **config) -> Path:
    """A run folder copied from the sample, its meta.json saying how it was run (``config`` over a full bench's)."""
    folder = Path(shutil.copytree(SAMPLE, results / name, ignore=shutil.ignore_patterns("raw")))
    meta = json.loads((folder / "meta.json").read_text())
    meta["complete"] = True
    meta["config"] = {**meta["config"], "quick": "False", "scenarios": "[]", "impls": "[]", "sweep": "[]",
                      "trace_file": "None", **config}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_a_notebook_reads_the_newest_full_bench_and_says_so_when_latest_is_not_one(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    from harness.output.notebook import NoRunError, choose_run

    monkeypatch.delenv("KVB_RUN", raising=False)
    results = tmp_path / "results"
    results.mkdir()
    _run_folder(results, "reference")
    full = _run_folder(results, "20261201-100000")
    quick = _run_folder(results, "20261202-100000-quick", quick="True")
    (results / "latest").symlink_to(quick.name)
    chosen = choose_run(None, tmp_path)
    assert chosen.data.run_dir == full  # not results/latest, a --quick run; not the older committed one
    text = "\n".join(chosen.lines())
    assert f"run:     {full}" in text and "results/latest is not a full `make bench` run" in text
    assert "20261202-100000-quick" in text and "RUN = " in text and "KVB_RUN" in text  # the reader may choose
    (results / "latest").unlink()
    (results / "latest").symlink_to(full.name)
    assert "results/latest, a full" in choose_run(None, tmp_path).reason
    assert choose_run(str(quick), tmp_path).data.run_dir == quick  # named: read, whatever it is
    monkeypatch.setenv("KVB_RUN", quick.name)
    assert choose_run(None, tmp_path).data.run_dir == quick
    monkeypatch.delenv("KVB_RUN")
    shutil.rmtree(full)
    shutil.rmtree(results / "reference")
    (results / "latest").unlink()
    with pytest.raises(NoRunError, match=r"no full `make bench` run .* KVB_RUN"):
        choose_run(None, tmp_path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_copied_out_of_the_repository_says_what_it_needs(path: Path, tmp_path: Path) -> None:
    """Its first cell, run where neither the repository nor the project is to be found: one clear error, not a bare
    StopIteration (``python -S``: no site-packages, so no installed project either)."""
    import subprocess

    book = nbformat.read(path, as_version=4)
    first = next(c.source for c in book.cells if c.cell_type == "code")
    code = "\n".join(line for line in first.splitlines() if not line.startswith("%"))
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and "StopIteration" not in done.stderr
    assert "RuntimeError: this notebook reads kvblock-bench runs" in done.stderr
    assert "pip install -e" in done.stderr
