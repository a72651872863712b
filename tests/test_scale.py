"""The scale sweeps (issue 29): the families, what a sweep run measures, memory at the peak, growth slopes.

Timings are not asserted (they belong in benchmarks); what is: the catalogue's families and their sizes, the
default run leaving them out, the memory study's instruments (exact for arrays, memray agreeing with them and
leaving the harness's own allocations out), the slope fit and its interval, and the files and README section
the growth figure writes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from harness.base.rows import Row, write_rows
from harness.errors import InputError
from harness.output import growth, sections
from harness.output.rundata import RunData
from harness.run import matrix
from harness.run.runner import RunConfig, build_plan, check_config
from harness.studies import memory, scale
from impls import REGISTRY
from scenarios import SCENARIOS, generate
from tests.test_compare import make_run

ROOT = Path(__file__).resolve().parents[1]
DESIGNS = ("dict", "list", "flat", "flat-rows")


# -- the families -----------------------------------------------------------------------------------------
def sizes(family: str) -> dict[str, float]:
    names = matrix.sweep_scenarios([family], SCENARIOS)
    axis = scale.FAMILY_AXES[family]
    return {n: {r.metric: r.value for r in scale.config_rows(n, generate(n, steps=2))}[axis] for n in names}


def test_every_family_sweeps_at_least_four_sizes_over_the_issue_s_ranges() -> None:
    assert set(scale.FAMILY_AXES) == set(matrix.SWEEPS)
    context, pool, running = sizes("context"), sizes("pool"), sizes("concurrency")
    assert min(context.values()) == 4096 and max(context.values()) == 2**20 and len(context) >= 4
    assert min(pool.values()) == 16384 and max(pool.values()) == 2**20 and len(pool) >= 4
    assert max(running.values()) == 4096 and len(running) >= 4
    for family in (context, pool, running):
        assert len(set(family.values())) == len(family)  # one size per scenario


def test_context_sequences_really_grow_long() -> None:
    """Some prompts of the 1M-token point reach the limit; the table has rows for more sequences than run."""
    trace = generate("context-1048576", steps=50)
    prompts = trace.a1[trace.op == 1]  # ALLOCATE
    assert prompts.max() >= 2**20 // 2
    assert trace.config["max_seqs"] == 256 and int(trace.running_per_step().max()) == 64


def test_the_default_run_leaves_the_scale_sweeps_out_and_a_sweep_runs_only_them() -> None:
    default = matrix.default_scenarios(SCENARIOS)
    assert "paper" in default and "concurrency-1024" in default
    assert not any(n.startswith(("context-", "pool-")) or n in ("concurrency-2048", "concurrency-4096")
                   for n in default)
    plan = build_plan(RunConfig(sweep=["pool", "context"], memory=True), list(REGISTRY))
    names = [p.scenario for p, _ in plan]
    assert names == [n for n in SCENARIOS if n.startswith(("context-", "pool-"))]
    for p, _ in plan:  # the default matrix's rules: every design batched, the memory and table-copy studies
        assert {(d, "batched") for d in DESIGNS} <= set(p.cells)
        assert {"memory", "table_copy"} <= set(p.studies) and "paced" not in p.studies
    assert all("memory" not in p.studies for p, _ in build_plan(RunConfig(sweep=["pool"]), ["flat"]))


def test_sweep_input_errors() -> None:
    with pytest.raises(InputError, match="--sweep: unknown family bogus"):
        matrix.sweep_scenarios(["bogus"], SCENARIOS)
    with pytest.raises(InputError, match="--sweep or --scenario"):
        check_config(RunConfig(sweep=["pool"], scenarios=["paper"]))


def test_config_rows_state_the_trace_s_sizes() -> None:
    trace = generate("context-4096", steps=20)
    rows = {r.metric: r for r in scale.config_rows("context-4096", trace)}
    assert set(rows) == set(scale.CONFIG_METRICS)
    assert rows["trace_max_tokens"].value == 4096 and rows["trace_num_blocks"].value == 16 * 256
    assert rows["trace_running"].value == 64 and rows["trace_peak_blocks"].value == trace.header["peak_blocks_in_use"]
    assert all(r.impl == r.regime == "-" and r.source == "trace header" for r in rows.values())


# -- memory at the peak -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_trace():
    return generate("paper", steps=40, running=16, num_blocks=2048, max_blocks_per_seq=64)


def test_peak_step_is_where_the_most_blocks_are_in_use(small_trace) -> None:
    mgr, replayer, in_use = REGISTRY["dict"](**small_trace.config), memory.Replayer(small_trace), []
    for step in range(small_trace.num_steps):
        replayer.advance(mgr, step, step + 1)
        in_use.append(mgr.num_blocks - mgr.num_free_blocks())
    assert memory.peak_step(small_trace) == int(np.argmax(in_use)) + 1
    assert max(in_use) == small_trace.header["peak_blocks_in_use"]


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_memory_rows_for_every_implementation(small_trace) -> None:
    cells = [(i, "batched") for i in ("dict", "flat", "flat-rows", "list-jit")] + [("dict", "per-call")]
    rows = memory.memory_rows("paper", small_trace, cells, REGISTRY)
    measured = {r.impl: r for r in rows if r.metric == "memory_bytes"}
    assert set(measured) == {"dict", "flat", "flat-rows", "list-jit"} and measured["dict"].regime == "batched"
    assert all(r.status == "ok" and r.value > 0 and r.unit == "B" and r.how for r in rows)
    assert {r.source for r in measured.values()} == {"memray"}  # what the process allocated, for every design
    flat = REGISTRY["flat"](**small_trace.config)
    assert measured["flat"].value >= flat.table.nbytes + flat.ints.nbytes
    stated = {r.impl: r.value for r in rows if r.metric == "memory_stated_bytes"}
    assert stated["flat"] == flat.memory_bytes() and measured["flat"].steps == memory.peak_step(small_trace)


def test_memray_agrees_with_nbytes_and_leaves_the_harness_out(small_trace) -> None:
    """Cross-check of the two instruments on the design whose bytes are known exactly; an array the caller
    (not the implementation) allocates while the manager is built is not counted."""
    steps = memory.peak_step(small_trace)
    memory.measure_one(REGISTRY["flat"], small_trace, steps)  # compiled and warm
    kept = []

    def build():
        mgr = REGISTRY["flat"](**small_trace.config)
        memory.Replayer(small_trace).advance(mgr, 0, steps)
        kept.append(np.ones(1 << 20))  # 8 MiB of the harness's own, live at the end
        return mgr

    mgr, live = memory.live_bytes(build, memory.code_roots(REGISTRY["flat"]))
    exact = mgr.table.nbytes + mgr.ints.nbytes
    assert exact <= live < exact + 64 * 1024  # the arrays, plus the manager's few Python objects


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_growing_designs_hold_more_at_a_bigger_peak() -> None:
    """Positive control: the dict design's measured bytes follow the blocks it holds; flat's do not."""
    small = generate("context-4096", steps=30)
    big = generate("context-16384", steps=30)
    value = {}
    for name, trace in (("small", small), ("big", big)):
        rows = memory.memory_rows(name, trace, [("dict", "batched"), ("flat", "batched")], REGISTRY)
        value[name] = {r.impl: r.value for r in rows if r.metric == "memory_bytes"}
    assert value["big"]["dict"] > 2 * value["small"]["dict"]
    for name, trace in (("small", small), ("big", big)):  # flat holds its constructor's arrays, nothing more
        fresh = REGISTRY["flat"](**trace.config)
        arrays = fresh.table.nbytes + fresh.ints.nbytes  # memray also sees the objects around them: a few KiB
        assert arrays <= value[name]["flat"] <= arrays + 8192, (name, value[name]["flat"], arrays)


# -- growth slopes and the figure -------------------------------------------------------------------------
@pytest.mark.parametrize(("df", "expected"), [(1, 12.706205), (2, 4.302653), (4, 2.776445), (30, 2.042272),
                                              (1000, 1.962339)])
def test_t_quantile(df: int, expected: float) -> None:
    assert growth.t_quantile(0.975, df) == pytest.approx(expected, abs=2e-6)


def test_fit_slope_recovers_a_power_law_and_widens_with_scatter() -> None:
    xs = [2.0**k for k in range(4, 10)]
    slope, lo, hi = growth.fit_slope(xs, [3 * x**0.5 for x in xs])
    assert slope == pytest.approx(0.5) and hi - lo == pytest.approx(0.0, abs=1e-9)
    rng = np.random.default_rng(0)
    noisy = [3 * x**0.5 * math.exp(rng.normal(0, 0.2)) for x in xs]
    slope, lo, hi = growth.fit_slope(xs, noisy)
    assert lo < 0.5 < hi and hi - lo > 0.05


def _synthetic_run(tmp_path: Path) -> Path:
    """A run with a context family of four sizes: flat's cost flat, dict's linear; memory per design."""
    rows = []
    for k, tokens in enumerate((4096, 16384, 65536, 262144)):
        name = f"context-{tokens}"
        rows += [Row(name, "-", "-", "trace_max_tokens", tokens, "tokens", "trace header")]
        rows += [Row(name, "flat", "batched", "seq_step_ns", 10.0 + k % 2 * 0.1, "ns", "rdtsc", ci_low=9.0,
                     ci_high=11.0),
                 Row(name, "dict", "batched", "seq_step_ns", tokens / 10, "ns", "perf_counter_ns"),
                 Row(name, "flat", "batched", "memory_bytes", 64.0 * tokens, "B", "nbytes"),
                 Row(name, "flat", "c-one-copy", "table_copy_bytes_per_step", 8.0 * tokens, "B/step", "computed")]
    rows.append(Row("paper", "flat", "batched", "seq_step_ns", 9.0, "ns", "rdtsc"))  # not a family's
    run = tmp_path / "run"
    run.mkdir()
    write_rows(run / "results.csv", rows)
    (run / "meta.json").write_text(json.dumps({"git_commit": "abc", "command_line": "kvblock-bench run --sweep "
                                               "context", "started": "2026-01-01T10:00:00+0000",
                                               "finished": "2026-01-01T10:21:05+0000"}))
    return run


def test_slopes_of_a_run(tmp_path: Path) -> None:
    found = {(s.family, s.impl, s.regime, s.metric): s for s in growth.slopes(RunData.load(_synthetic_run(tmp_path)))}
    assert set(found) == {("context", "flat", "batched", "seq_step_ns"), ("context", "dict", "batched", "seq_step_ns"),
                          ("context", "flat", "batched", "memory_bytes"),
                          ("context", "flat", "c-one-copy", "table_copy_bytes_per_step")}
    assert found[("context", "dict", "batched", "seq_step_ns")].slope == pytest.approx(1.0)
    flat = found[("context", "flat", "batched", "seq_step_ns")]
    assert flat.ci_low < 0 < flat.ci_high and flat.points == 4 and (flat.x_min, flat.x_max) == (4096, 262144)
    assert flat.at_max == pytest.approx(10.1)
    assert found[("context", "flat", "batched", "memory_bytes")].slope == pytest.approx(1.0)


def test_the_console_says_how_each_cells_cost_grows_over_a_sweep(tmp_path: Path) -> None:
    from harness.output.console import console_summary

    text = console_summary(RunData.load(_synthetic_run(tmp_path)))
    line = next(x for x in text.splitlines() if x.startswith("growth over the context sweep, 4 Ki to 256 Ki"))
    assert "dict 1.00 [" in line and "flat " in line and "memory" not in line and "copy" not in line
    assert "(10.1 ns)" in line  # flat's figure at the largest size
    plain = make_run(tmp_path / "plain", [Row("paper", "flat", "batched", "seq_step_ns", 3.0, "ns", "rdtsc")])
    assert "growth over" not in console_summary(plain)  # no sweep, no line


def test_render_writes_the_figure_the_slopes_and_the_readme_section(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path)
    written = {p.name for p in growth.render(run)}
    assert written == {"growth.png", "growth.svg", growth.SLOPES_CSV, growth.SLOPES_MD}
    back = growth.read_slopes(run / growth.SLOPES_CSV)
    assert back == growth.read_slopes(run / growth.SLOPES_CSV) and len(back) == 4
    assert back[0].family == "context" and isinstance(back[0].points, int)
    md = (run / growth.SLOPES_MD).read_text()
    assert "| `dict` | batched | 1.00 [1.00, 1.00]; 26,214 ns at 256 Ki |  |  | 4 |" in md  # cost only
    assert "| `flat` | c-one-copy |  |  | 1.00 [1.00, 1.00]; 2 MiB at 256 Ki | 4 |" in md
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{growth.BEGIN}\nold\n{growth.END}\noutro\n")
    growth.write_growth_readme(readme, run)  # linked relative to the README: run/...
    assert "](run/figures/growth.png)" in readme.read_text()
    growth.write_growth_readme(readme, run, "results/scale")
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{growth.END}\noutro\n") and "old" not in text
    assert "results/scale/figures/growth.png" in text and md.rstrip() in text and "`abc`" in text
    assert "took 21 min 5 s" in text
    readme.write_text("no markers")
    with pytest.raises(InputError, match="growth:begin"):
        growth.write_growth_readme(readme, run)


def test_a_run_without_sweeps_renders_no_growth_figure(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", [Row("paper", "flat", "batched", "seq_step_ns", 9.0, "ns", "rdtsc")])
    assert growth.render(run) == []


def test_readme_growth_section_comes_from_the_committed_run() -> None:
    """Until the scale run is committed the page says so; after, it says exactly what the run gives, linked
    relative to the page."""
    page = sections.doc_path("growth")
    readme = page.read_text()
    section = readme.split(growth.BEGIN)[1].split(growth.END)[0]
    committed = ROOT / "results" / "scale"
    if not (committed / growth.SLOPES_MD).is_file():
        assert section.lstrip().startswith("Not measured yet") and "make bench-scale" in section
    else:
        shown_as = Path(os.path.relpath(committed, page.parent)).as_posix()
        assert section == "\n" + growth.growth_section(committed, shown_as)


def test_a_metric_no_family_measured_gets_no_column(tmp_path: Path) -> None:
    """The default run sweeps concurrency without the memory study: its growth figure has no empty memory
    panel, only the metrics it measured."""
    run = RunData.load(_synthetic_run(tmp_path))
    run.df = run.df[run.df.metric != "memory_bytes"]
    fig = growth.fig_growth(run, growth.slopes(run))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["context: cost", "context: rule 3 copies"]
