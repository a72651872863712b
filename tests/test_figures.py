"""Every figure, rendered from a run that holds plug-ins, read as a reader reads it: every implementation the figure
is about is there, its legend names what it draws and draws what it names, no panel is empty, no two panels share
a title, every text is readable, and no two implementations share a colour.

The run is the committed sample (``results/sample/``) with three plug-ins added: copies of ``dict``'s, ``list``'s
and ``flat``'s rows (and raw samples) under plug-in names, as a run of three user designs writes them."""

from __future__ import annotations

import gzip
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import Collection
from matplotlib.colors import to_hex, to_rgba_array
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from harness.base.rows import Row, read_rows, write_rows
from harness.output import growth, plots
from harness.output.drawing import MIN_FONT, color, label, plugins_of
from harness.output.rundata import RunData
from impls import registry
from scenarios import PAPER

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "results" / "sample"
# plug-in name -> the built-in whose rows it takes
PLUGINS = {"mypkg.alpha:Alpha": "dict", "mypkg.beta:Beta": "list", "toy_bm:ToyBlockManager": "flat"}
STEMS = [*plots.FIGURES, "growth"]


def plugin_run(dest: Path) -> Path:
    """The sample run with :data:`PLUGINS` added (their rows, ratios and raw samples)."""
    shutil.copytree(SAMPLE, dest, ignore=shutil.ignore_patterns("figures"))
    rows = read_rows(dest / "results.csv")
    cells = {"seq_step_ns", "cpu_share_pct", "lookup_ns", "alloc_ns", "free_ns", "alloc_free_ns", "allocs_per_step",
             "step_p50_ns", "step_p99_ns", "step_mean_ns", "step_max_ns", "cpu_share_observed_pct",
             "cpu_share_observed_whole_step_pct", "lookup_ns_vs_flat", "alloc_free_ns_vs_flat", "seq_step_ns_vs_flat",
             "seq_step_ns_vs_flat_batched", "l1d_miss_pct", "compile_s"}
    added = [replace(r, impl=name) for name, source in PLUGINS.items() for r in rows
             if r.impl == source and r.metric in cells and r.regime in ("batched", "per-call", "step")]
    # the sweep's sizes, as every run since the scale sweeps writes them (the sample predates them)
    sizes = [Row(s, "-", "-", "trace_running", float(s.split("-")[1]), "seqs", "trace header")
             for s in dict.fromkeys(r.scenario for r in rows) if s.startswith("concurrency-")]
    write_rows(dest / "results.csv", rows + added + sizes)
    raw = dest / "raw" / PAPER
    for name, source in PLUGINS.items():
        for path in raw.glob(f"{source}__*.json.gz"):
            regime = path.name[len(source) + 2:-len(".json.gz")]
            if regime in ("batched", "per-call", "step"):
                (raw / f"{name}__{regime}.json.gz").write_bytes(gzip.compress(gzip.decompress(path.read_bytes())))
    return dest


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunData:
    return RunData.load(plugin_run(tmp_path_factory.mktemp("plugins") / "plugins"))


@pytest.fixture(scope="module")
def figures(run: RunData) -> dict[str, Figure | None]:
    out = {stem: make(run) for stem, make in plots.FIGURES.items()}
    out["growth"] = growth.fig_growth(run, growth.slopes(run))
    return out


# -- what each figure is about: the implementations a reader must find in it, from the run's rows ------------------
def _with(run: RunData, metric: str, scenarios=(PAPER,)) -> set[str]:
    df = run.df
    sel = df[(df.metric == metric) & df.scenario.isin(list(scenarios)) & (df.status == "ok") & (df.impl != "-")]
    return set(sel.impl)


def _swept(run: RunData) -> set[str]:
    df = run.df
    sel = df[(df.metric == "cpu_share_pct") & df.scenario.str.startswith("concurrency-") & (df.status == "ok")]
    counts = sel.groupby(["impl", "regime"]).scenario.nunique()
    return {impl for (impl, _), n in counts.items() if n >= 2}


EXPECTED = {
    "op_latency": lambda run: _with(run, "seq_step_ns"),
    "step_cdf": lambda run: {i for i, r in run.cells(PAPER) if run.raw(PAPER, i, r)},
    "cpu_share_concurrency": _swept,
    "cpu_share_paced": lambda run: {p.impl for p in plots.paced_points(run)[0]},
    "l1d_miss": lambda run: {"dict", "list", "flat"},  # a quick run measures none: the article's designs stand alone
    "allocs_per_step": lambda run: _with(run, "allocs_per_step"),
    "idwidth": lambda run: set(),
    "paper_vs_article": lambda run: {"dict", "list", "flat", *PLUGINS},
    "prefix_cache": lambda run: {i for s in ("system-prompt-256",) for i, _ in run.cells(s)},
    "growth": _swept,
}


# -- reading a figure back ---------------------------------------------------------------------------------------
def _visible_axes(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def _legends(fig: Figure) -> list[Legend]:
    return [leg for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes),
                            *(leg for sub in getattr(fig, "subfigs", []) for leg in sub.legends)] if leg is not None]


def _names(fig: Figure) -> set[str]:
    """Every name a reader can find in the figure: legend entries, tick labels, titles (before a comma)."""
    words = [t.get_text() for leg in _legends(fig) for t in leg.get_texts()]
    words += [t.get_text() for ax in fig.axes for t in [*ax.get_xticklabels(), *ax.get_yticklabels()]]
    return {w.split(",")[0].split(" 0")[0].split(" -0")[0].strip() for w in words}


def _colour(value) -> str | None:
    """The first colour of a colour or a collection's colours as ``#RRGGBB``; None for none or a transparent one."""
    if isinstance(value, str) and value == "none":
        return None
    arr = to_rgba_array(value)
    if not len(arr) or arr[0][3] == 0:
        return None
    return to_hex(arr[0][:3]).upper()


def _drawn_colours(ax) -> set[str]:
    """The colours of an axes' data: bar faces, lines, markers and collections (legend artists are not children)."""
    out = set()
    for artist in ax.get_children():
        if isinstance(artist, Rectangle) and artist is not ax.patch and artist.get_width() and artist.get_height():
            out.add(_colour(artist.get_facecolor()))
        elif isinstance(artist, Line2D) and len(artist.get_xdata()):
            out |= {_colour(artist.get_color()), _colour(artist.get_markerfacecolor()),
                    _colour(artist.get_markeredgecolor())}
        elif isinstance(artist, Collection) and len(artist.get_paths()):
            out |= {_colour(artist.get_facecolor()), _colour(artist.get_edgecolor())}
    return out - {None}


def _legend_colours(leg: Legend) -> dict[str, str]:
    """Legend label -> the colour of its handle."""
    out = {}
    for handle, text in zip(leg.legend_handles, leg.get_texts(), strict=True):
        if isinstance(handle, Rectangle):
            found = _colour(handle.get_facecolor())
        elif isinstance(handle, Line2D):
            found = _colour(handle.get_color())
        elif isinstance(handle, Collection):
            found = _colour(handle.get_facecolor()) or _colour(handle.get_edgecolor())
        else:
            found = None
        if found:
            out[text.get_text()] = found
    return out


def _impl_colours(run: RunData) -> dict[str, str]:
    impls = {i for i in run.df.impl if i in registry.BY_NAME} | set(plugins_of(run))
    return {color(i, run).upper(): i for i in impls}


def _figure(figures: dict, stem: str) -> Figure:
    fig = figures[stem]
    assert fig is not None, f"{stem}: not drawn from a run that has its rows"
    return fig


# -- the checks, each figure by each ---------------------------------------------------------------------------
@pytest.mark.parametrize("stem", STEMS)
def test_every_implementation_the_figure_is_about_is_in_it(run: RunData, figures: dict, stem: str) -> None:
    expected = EXPECTED[stem](run)
    names = _names(_figure(figures, stem))
    missing = sorted(i for i in expected if label(i) not in names)
    assert not missing, f"{stem}: {missing} not in the figure (names found: {sorted(names)})"


def test_the_plugins_are_in_every_figure_that_shows_their_rows(run: RunData, figures: dict) -> None:
    """The README's promise: a plug-in appears in every report, table and figure like a built-in one."""
    about = {stem for stem in STEMS if set(PLUGINS) & EXPECTED[stem](run)}
    assert about >= {"op_latency", "step_cdf", "cpu_share_concurrency", "cpu_share_paced", "allocs_per_step",
                     "paper_vs_article", "growth"}
    for stem in about:
        assert set(map(label, PLUGINS)) <= _names(figures[stem]), stem


@pytest.mark.parametrize("stem", STEMS)
def test_legend_entries_name_what_is_drawn_and_what_is_drawn_is_named(run: RunData, figures: dict,
                                                                     stem: str) -> None:
    fig = _figure(figures, stem)
    owners = _impl_colours(run)
    drawn = {c for ax in _visible_axes(fig) for c in _drawn_colours(ax)}
    named = set()
    for leg in _legends(fig):
        for text, colour in _legend_colours(leg).items():
            if colour in owners:
                named.add(colour)
                assert colour in drawn, f"{stem}: legend entry {text!r} ({colour}) has nothing drawn in that colour"
    ticks = {t.get_text() for ax in fig.axes for t in [*ax.get_xticklabels(), *ax.get_yticklabels()]}
    for colour in drawn & set(owners):
        assert colour in named or label(owners[colour]) in ticks, \
            f"{stem}: {owners[colour]} drawn ({colour}) but neither its legend nor a tick names it"


def _heading(ax) -> str:
    """The heading of the row of panels an axes sits in (a subfigure's title), "" for a plain figure's axes."""
    title = getattr(ax.figure, "_suptitle", None) if ax.figure is not ax.get_figure(root=True) else None
    return f"{title.get_text()}: " if title is not None else ""


@pytest.mark.parametrize("stem", STEMS)
def test_no_panel_is_empty_and_no_two_share_a_title(figures: dict, stem: str) -> None:
    fig = _figure(figures, stem)
    for ax in _visible_axes(fig):
        data = [a for a in ax.get_children()
                if (isinstance(a, Rectangle) and a is not ax.patch and a.get_width() and a.get_height())
                or (isinstance(a, Line2D) and len(a.get_xdata()) and not a.get_label().startswith("_child"))
                or (isinstance(a, Collection) and len(a.get_paths()))]
        assert data, f"{stem}: panel {ax.get_title()!r} draws nothing"
    titles = [_heading(ax) + ax.get_title() for ax in _visible_axes(fig) if ax.get_title()]
    assert len(titles) == len(set(titles)), f"{stem}: panels share a title: {titles}"


@pytest.mark.parametrize("stem", STEMS)
def test_every_text_is_readable(figures: dict, stem: str) -> None:
    fig = _figure(figures, stem)
    small = sorted({(t.get_fontsize(), t.get_text()[:40]) for t in fig.findobj(Text)
                    if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT})
    assert not small, f"{stem}: text below {MIN_FONT} pt: {small[:5]}"


def test_no_two_implementations_of_a_run_share_a_colour(run: RunData) -> None:
    from tests.test_plots_notebooks import _lab

    impls = sorted({i for i in run.df.impl if i in registry.BY_NAME} | set(plugins_of(run)))
    colours = {i: color(i, run) for i in impls}
    close = [(a, b) for k, a in enumerate(impls) for b in impls[k + 1:]
             if np.linalg.norm(_lab(colours[a]) - _lab(colours[b])) < 20]
    assert not close, f"colours too alike: {close}"


def test_every_plugin_colour_is_far_from_every_other_colour() -> None:
    from tests.test_plots_notebooks import _lab

    every = [r.color for r in registry.RECORDS] + list(registry.PLUGIN_COLORS)
    close = [(a, b) for k, a in enumerate(every) for b in every[k + 1:]
             if np.linalg.norm(_lab(a) - _lab(b)) < 20]
    assert not close, f"colours too alike: {close}"


# -- the defects of each figure, one by one (the reference run: a full run's shapes) ------------------------------
REFERENCE = REPO / "results" / "reference"


@pytest.fixture(scope="module")
def reference() -> RunData:
    return RunData.load(REFERENCE)


def test_labels_never_rename_an_implementation() -> None:
    """A label is the name, at most after the article's design letter (``A dict``): never ``vllm-v1+pc``."""
    assert all(r.label == r.name or r.label.endswith(f" {r.name}") for r in registry.RECORDS), \
        [(r.name, r.label) for r in registry.RECORDS if not r.label.endswith(r.name)]


def test_op_latency_puts_a_regime_timed_by_whole_steps_in_one_panel_and_names_its_whiskers(reference) -> None:
    fig = plots.fig_op_latency(reference)
    step = [ax for ax in fig.axes if ax.get_title().startswith("step regime")]
    assert len(step) == 1  # one bar per implementation, not five groups of which four are empty
    ticks = {t.get_text() for t in step[0].get_xticklabels()}
    assert ticks == {label(i) for i, r in reference.cells(PAPER) if r == "step"}
    assert fig.get_figheight() <= 15
    for ax in fig.axes:
        entries = [t.get_text() for t in ax.get_legend().get_texts()]
        assert not any("see note" in e for e in entries)
        assert any(e.startswith("whiskers: ") for e in entries)
        assert ax.get_axisbelow() is True  # gridlines behind the bars


def test_the_concurrency_figure_says_only_what_it_draws(reference) -> None:
    fig = plots.fig_cpu_concurrency(reference)
    notes = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "dashed" not in notes  # the reference sweeps the batched regime only: every line is solid
    assert all(ax.get_title().startswith("batched regime: ") for ax in fig.axes)
    for ax in fig.axes:
        markers = {line.get_marker() for line in ax.get_lines() if line.get_mfc() == "none"}  # the article's
        entries = {h.get_marker() for h in ax.get_legend().legend_handles if isinstance(h, Line2D)
                   and h.get_linestyle() in ("None", "") and h.get_mfc() == "none"}
        assert markers == entries, ax.get_title()


def test_panel_titles_name_only_what_the_panel_holds(reference) -> None:
    native = {label(i) for i in registry.names("native")}
    twins = {label(i) for i in registry.names("twin")}
    for stem in ("op_latency", "step_cdf", "cpu_share_concurrency", "cpu_share_paced"):
        for ax in plots.FIGURES[stem](reference).axes:
            shown = {t.get_text() for t in ax.get_legend().get_texts()} | {t.get_text() for t in ax.get_xticklabels()}
            title = ax.get_title()
            assert ("in C++" in title) == bool(native & shown) or "step()" in title, (stem, title)
            assert ("compiled twins" in title) == bool(twins & shown) or "step()" in title, (stem, title)


def test_growth_explains_its_copy_variants_and_titles_each_panel_once(reference) -> None:
    fig = growth.fig_growth(reference, growth.slopes(reference))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert len(titles) == len(set(titles))
    copies = [ax for ax in fig.axes if "rule 3 copies" in ax.get_title()]
    entries = [t.get_text() for ax in copies for t in ax.get_legend().get_texts()]
    assert entries and all(": " in e for e in entries)  # `a-per-seq: a copy per sequence 0.94 [...]`


def test_idwidth_rows_have_intervals_and_the_figure_draws_them(tmp_path: Path) -> None:
    from harness.studies import idwidth

    rows = idwidth.idwidth_rows(large_seqs=0, runs=5)
    lookups = [r for r in rows if r.metric == "idwidth_lookup_ns"]
    assert lookups and all(r.ci_low <= r.value <= r.ci_high for r in lookups)
    run_dir = tmp_path / "idwidth"
    run_dir.mkdir()
    write_rows(run_dir / "results.csv", rows)
    fig = plots.fig_idwidth(RunData.load(run_dir))
    whiskers = [c for c in fig.axes[0].collections if len(c.get_paths())]
    assert len(whiskers) == len(lookups)
    assert "whiskers: 95 % interval" in fig.axes[0].get_title()
