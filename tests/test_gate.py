"""The CI gate's pieces: its committed trace, the replay regions it measures, callgrind parsing, the checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.base.drivers import Prepared
from harness.base.replay import REGIMES, check_end_state
from harness.counters import callgrind
from harness.counters import regions as callgrind_region
from harness.gate import command as gate
from harness.gate import config as gate_config
from harness.gate import counting as gate_jobs
from harness.gate import saved as gate_baseline
from scenarios import load
from tests.registered import impl_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(load(gate.TRACE))


def test_committed_trace_is_what_the_generator_makes() -> None:
    """If the scenario generator changes, regenerate: python -m harness.gate.command --write-trace."""
    assert load(gate.TRACE).header["checksum"] == gate.gate_trace().header["checksum"]


def test_trace_holds_the_measured_steps(prep: Prepared) -> None:
    assert prep.num_steps >= gate.WARM_STEPS + gate.STEPS


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("impl", impl_params())
def test_regions_replay_the_trace_exactly(prep: Prepared, impl: str, regime: str) -> None:
    """advance() in pieces (as the gate calls it) reaches the trace's end state with its CoW counts."""
    mgr, advance, cows = callgrind_region.prepare_cell(prep, impl, regime)
    advance(0, 5)
    advance(5, 5)
    advance(5, prep.num_steps)
    callgrind_region.check_cows(prep, cows, 0, prep.num_steps, f"{impl} {regime}")
    check_end_state(prep.trace, mgr)


def test_flat_batched_region_allocates_nothing(prep: Prepared) -> None:
    assert gate_jobs.allocations(prep, "flat", "batched", 4, 8) == (0.0, 0.0, "nrt-stats")


def test_region_script_runs_natively(prep: Prepared, capsys: pytest.CaptureFixture[str]) -> None:
    """The script callgrind runs works outside valgrind, where its client requests do nothing."""
    ok, why = callgrind.available()
    if not ok:
        pytest.skip(why)
    argv = ["--trace", str(gate.TRACE), "--lib", str(callgrind.region_library()), "--warm", "4", "--steps", "4",
            "--cache-warm", "2", "--cell", "flat", "batched", "--cell", "dict", "per-call"]
    assert callgrind_region.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == ["flat|batched: ok", "dict|per-call: ok"]


DUMP = """# callgrind format
version: 1
desc: D1 cache: 49152 B, 64 B, 12-way associative
desc: Trigger: Client Request: {label}
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
summary: 18446744073709535568 1 2 3 4 5 6 7 8
fn=(1) f
0 1
totals: {totals}
"""


def test_dumps_are_read_from_totals(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    (tmp_path / "callgrind.out.1").write_text(DUMP.format(label="flat|batched|32", totals="1100 400 200 9 30 10"))
    (tmp_path / "callgrind.out.2").write_text(DUMP.format(label="flat|batched|0", totals="100 40 20 1 5 2 1 1 1"))
    (tmp_path / "callgrind.out").write_text("events: Ir\ntotals: 0\n")  # the end-of-program dump has no label
    dumps = callgrind.parse_dumps(out)
    assert sorted(dumps) == ["flat|batched|0", "flat|batched|32"]
    counts = callgrind.Counts.from_events(dumps["flat|batched|32"], dumps["flat|batched|0"], seq_steps=100, steps=2)
    assert (counts.ir, counts.dr, counts.dw, counts.d1mr, counts.d1mw, counts.dlmw) == (1000, 360, 180, 25, 8, -1)
    assert counts.instructions_per_seq_step == 10.0
    assert counts.l1d_miss_pct == pytest.approx(33 / 540 * 100)


def test_without_cache_simulation_there_is_no_miss_rate() -> None:
    counts = callgrind.Counts.from_events({"Ir": 500}, {"Ir": 100}, seq_steps=4, steps=1)
    assert (counts.ir, counts.dr, counts.l1d_miss_pct) == (400, None, None)


def test_measure_rejects_ranges_outside_the_trace() -> None:
    if not callgrind.available()[0]:
        pytest.skip("valgrind unavailable")
    with pytest.raises(ValueError, match="do not fit"):
        callgrind.measure(gate.TRACE, [("flat", "batched")], warm_steps=40, steps=40)


OURS = gate_config.load_config(ROOT / "pyproject.toml")


def figures(flat_ir: int, dict_ir: int, flat_allocs: float = 0.0) -> dict:
    cells = {key: gate.CellFigures(*key) for key in [("flat", "batched"), ("dict", "batched")]}
    for key, ir in zip(cells, (flat_ir, dict_ir), strict=True):
        cells[key].instructions, cells[key].seq_steps = [ir, ir], 100
        cells[key].memray_per_step = cells[key].nrt_per_step = 0.0
    cells[("flat", "batched")].memray_per_step = flat_allocs
    return cells


def test_our_rules_come_from_our_pyproject() -> None:
    """Our own ceilings, floors and allocation rule are configuration, read from pyproject.toml."""
    assert OURS.source.endswith("pyproject.toml [tool.kvblock-bench.gate]")
    assert OURS.rule(("flat", "batched")).zero_allocations
    assert OURS.wall is not None and (OURS.wall.slower, OURS.wall.faster) == ("dict", "flat")


def test_gate_passes_and_fails_on_its_floors() -> None:
    assert gate.check(figures(1_000, 80_000), (300.0, 4.0), OURS) == []
    assert gate.check(figures(1_000, 10_000), (300.0, 100.0), OURS) == []  # exactly on both floors passes
    assert gate.check(figures(1_000, 9_000), None, OURS) == [
        "dict batched needs 9.0x the instructions of batched flat per sequence-step; the floor is 10x"]
    assert gate.check(figures(1_000, 80_000, flat_allocs=0.5), None, OURS) == [
        "flat batched allocates: 0.5 (memray) and 0 Numba runtime allocations per step (must be 0)"]
    assert gate.check(figures(1_000, 80_000), (300.0, 150.0), OURS) == [
        "batched flat is only 2.0x faster than batched dict by the clock; the floor is 3x"]
    unstable = figures(1_000, 80_000)
    unstable[("dict", "batched")].instructions = [80_000, 80_001]
    assert "differ between identical runs" in gate.check(unstable, None, OURS)[0]


def test_a_cells_figure_is_its_fewest_count_over_the_heap_layouts() -> None:
    """Runs in other heap layouts may differ (an interpreted design's count moves with where its objects land):
    the figure is their fewest; only runs of one layout must agree."""
    cells = figures(1_000, 80_000)
    dict_cell = cells[("dict", "batched")]
    dict_cell.instructions, dict_cell.layouts = [80_400, 80_400, 80_000, 80_100], [0, 0, 1, 2]
    assert dict_cell.instructions_per_seq_step == 800.0
    assert gate.check(cells, None, OURS) == []
    dict_cell.instructions = [80_400, 80_401, 80_000, 80_100]
    assert gate.check(cells, None, OURS) == [
        "dict batched: instruction counts differ between identical runs (heap layout 0): [80400, 80401]"]
    saved = {"instructions": [80_400, 80_000], "seq_steps": 100, "layouts": [0, 1]}
    assert gate_baseline.per_seq_step(saved) == 800.0 and gate_baseline.cell_problem(
        {"impl": "dict", "regime": "batched", **saved}) == ""
    assert "layouts must be a list of heap layouts" in gate_baseline.cell_problem(
        {"impl": "dict", "regime": "batched", **saved, "layouts": [0, -1]})
    assert gate.GATE_LAYOUTS[0] == gate.GATE_LAYOUTS[1] and set(gate.GATE_LAYOUTS) == set(callgrind.LAYOUTS)


def test_without_rules_only_the_runs_agreement_is_checked() -> None:
    bare = gate_config.GateConfig("none")
    assert gate.check(figures(9_000, 9_000, flat_allocs=3.0), (1.0, 1.0), bare) == []


def test_gate_fails_above_its_instruction_ceiling() -> None:
    """A cell needing more instructions per sequence-step than its ceiling fails; exactly on it passes."""
    config = gate_config.parse({"rule": [{"impl": "flat", "regime": "batched",
                                          "max_instructions_per_seq_step": 45.0}]}, "test")
    assert gate.check(figures(4_500, 80_000), None, config) == []
    assert gate.check(figures(4_510, 80_000), None, config) == [
        "flat batched needs 45.1 instructions per sequence-step; the ceiling is 45"]
    unmeasured = figures(4_510, 80_000)
    unmeasured[("flat", "batched")].instructions = None
    assert gate.check(unmeasured, None, config) == []  # not measured here: the gate reports it apart


def test_our_ceilings_fail_flat_above_30_and_cpp_flat_above_flat() -> None:
    """The committed rules: batched flat at most 30 instructions per sequence-step, batched cpp-flat at most
    batched flat's (within 2 %); one instruction over either fails the gate, exactly on either passes."""
    def cells(flat_ir: int, cpp_ir: int) -> dict:
        made = figures(flat_ir, 80_000)
        made[("cpp-flat", "batched")] = gate.CellFigures("cpp-flat", "batched", [cpp_ir, cpp_ir], 100, 0.0, 0.0)
        return made

    assert OURS.rule(("flat", "batched")).max_instructions_per_seq_step == 30
    assert OURS.rule(("cpp-flat", "batched")).max_instructions_vs_base == 1.02
    assert gate.check(cells(3_000, 3_000), None, OURS) == []
    assert gate.check(cells(3_001, 2_900), None, OURS) == [
        "flat batched needs 30.0 instructions per sequence-step; the ceiling is 30"]
    assert gate.check(cells(2_900, 2_958), None, OURS) == []
    assert gate.check(cells(2_900, 2_959), None, OURS) == [
        "cpp-flat batched needs 29.59 instructions per sequence-step, 1.020x batched flat's 29.00; the ceiling "
        "is 1.02x"]
    assert gate.table(cells(2_900, 2_959), OURS).splitlines()[-1].split()[6] == "1.02x"


def test_a_ratio_ceiling_needs_batched_flat_measured() -> None:
    """Without batched flat's count a ratio ceiling checks nothing (the missing figure is reported apart)."""
    config = gate_config.parse({"rule": [{"impl": "cpp-flat", "regime": "batched",
                                          "max_instructions_vs_base": 1.0}]}, "test")
    alone = {("cpp-flat", "batched"): gate.CellFigures("cpp-flat", "batched", [5_000, 5_000], 100, 0.0, 0.0)}
    assert gate.check(alone, None, config) == []


def test_the_committed_ceiling_holds_the_flat_kernels() -> None:
    """Our ceiling sits just above what batched flat needs in the committed gate figures (within 5 %)."""
    cells = json.loads((ROOT / "results" / "gate" / "gate.json").read_text())["cells"]
    flat = next(c for c in cells if (c["impl"], c["regime"]) == ("flat", "batched"))
    needs = min(flat["instructions"]) / flat["seq_steps"]
    assert needs < OURS.rule(("flat", "batched")).max_instructions_per_seq_step <= needs * 1.05


def test_table_lists_every_cell() -> None:
    """Instructions per sequence-step are count / sequence-steps; the ratio is to batched flat; '-' marks
    what was not measured or has no floor."""
    text = gate.table(figures(1_000, 80_000, flat_allocs=0.25), OURS)
    header, *rows = [line.split() for line in text.splitlines()]
    assert header[:2] == ["impl", "regime"] and len(rows) == 2
    ceiling = format(OURS.rule(("flat", "batched")).max_instructions_per_seq_step, "g")
    # the last column: the cell's rule met or failed (flat allocates here), "no rule" where none asks anything
    assert rows[0] == ["flat", "batched", "10.0", "0.00", "1.0", "-", ceiling, "0.25", "0.00", "-", "FAILED"]
    assert rows[1] == ["dict", "batched", "800.0", "0.00", "80.0", "10", "-", "0.00", "0.00", "-", "met"]
    unmeasured = {("flat", "batched"): gate.CellFigures("flat", "batched")}
    assert gate.table(unmeasured, OURS).splitlines()[1].split() == ["flat", "batched", "-", "-", "-", "-", ceiling,
                                                                   "-", "-", "-", "not", "measured"]
    spread = gate.CellFigures("dict", "batched", [1_010, 1_010, 1_000, 1_004], 100, 0.0, 0.0, "memray", [0, 0, 1, 2])
    assert gate.table({("dict", "batched"): spread}).splitlines()[1].split()[2:4] == ["10.0", "1.00"]
    assert gate.table({("dict", "batched"): spread}).splitlines()[1].endswith("no rule")
    assert gate.CellFigures("flat", "batched", [10, 10], 4).instructions_per_seq_step == 2.5


def test_cells_put_batched_flat_first_and_native_designs_batched_only() -> None:
    assert gate.gate_cells(["dict"]) == [("flat", "batched"), ("dict", "batched"), ("dict", "per-call")]
    cells = gate.gate_cells(["flat", "cpp-flat"])
    assert cells == [("flat", "batched"), ("flat", "per-call"), ("cpp-flat", "batched")]
    assert gate.gate_impls(["x:Y"], OURS, contenders=False) == ["x:Y"]
    assert gate.gate_impls(None, gate_config.GateConfig("t", impls=("a:B",)), contenders=False) == ["a:B"]
    assert "dict" in gate.gate_impls(None, OURS, contenders=False)


@pytest.mark.slow
def test_cells_split_across_processes_count_about_the_same_instructions() -> None:
    """The bench deals callgrind cells to two valgrind processes: a cell's count moves only slightly with the
    other cells in its process (measured: up to 0.4 %, the interpreter's own state), and a fixed split
    repeats exactly."""
    if not callgrind.available()[0]:
        pytest.skip("valgrind unavailable")
    cells = [("flat", "batched"), ("dict", "batched"), ("list", "per-call")]
    together = callgrind.measure(gate.TRACE, cells, gate.WARM_STEPS, gate.STEPS, cache_sim=False)
    split = callgrind.measure_runs(gate.TRACE, cells, gate.WARM_STEPS, gate.STEPS, cache_sim=False, layouts=(0, 0),
                                   split=2)
    assert list(split[0]) == cells  # in the order asked
    assert {c: split[0][c].ir for c in cells} == {c: split[1][c].ir for c in cells}
    for c in cells:
        assert together[c].ir > 0 and split[0][c].ir == pytest.approx(together[c].ir, rel=0.01), c
