"""One registry record per implementation, and its facts stated nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run.matrix import ROLE_REGIMES, default_cells, plan_scenario
from impls import REGISTRY, UNAVAILABLE, registry

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for folder in ("harness", "impls", "scenarios", "benchmarks") for p in (ROOT / folder).rglob("*.py")]


def test_every_record_is_complete_and_loads_or_says_why() -> None:
    names = [r.name for r in registry.RECORDS]
    assert len(set(names)) == len(names)
    assert set(REGISTRY) | set(UNAVAILABLE) == set(names) and not set(REGISTRY) & set(UNAVAILABLE)
    for rec in registry.RECORDS:
        assert rec.role in registry.ROLES and rec.label and rec.description and rec.color.startswith("#")
        assert rec.name in REGISTRY or UNAVAILABLE[rec.name]
    # The article's three designs have its letters, once each; flat-rows is a design of ours, without one.
    letters = [r.letter for r in registry.RECORDS if r.role == "design" and r.letter]
    assert sorted(letters) == ["A", "B", "C"] and registry.BY_NAME["flat-rows"].letter is None


@pytest.mark.parametrize("rec", registry.RECORDS, ids=lambda r: r.name)
def test_labels_and_colours_live_only_in_the_registry(rec: registry.Impl) -> None:
    here = ROOT / "impls" / "registry.py"
    facts = [f'"{rec.color}"'] + ([f'"{rec.label}"'] if rec.label != rec.name else [])  # names are keys
    for fact in facts:
        elsewhere = [p.relative_to(ROOT) for p in SOURCES if p != here and fact in p.read_text()]
        assert not elsewhere, f"{fact} of {rec.name} is repeated in {elsewhere}"


def test_the_matrix_reads_roles_from_the_registry() -> None:
    impls = registry.names()
    paper = default_cells("paper", impls, ("per-call", "batched"))
    sweep = default_cells("concurrency-64", impls, ("per-call", "batched"))
    assert ("dict", "batched") in sweep and ("dict", "per-call") not in sweep and ("dict", "per-call") in paper
    assert ("vllm-v1", "batched") in paper and ("vllm-v1", "batched") not in sweep
    assert all(regime in ROLE_REGIMES.get(registry.record(i).role, (regime,)) for i, regime in paper)
    named = plan_scenario("paper", ["cpp-flat", "flat"], ("per-call", "batched"), explicit=True, quick=False,
                          enabled=[])
    assert ("cpp-flat", "per-call") not in named.cells and ("flat", "per-call") in named.cells
    assert plan_scenario("paper", ["flat"], ("batched",), explicit=True, quick=True,
                         enabled=["l1d", "table_copy", "allocations"]).studies == ["allocations", "l1d",
                                                                                    "table_copy"]


def test_the_default_matrix_leaves_out_slow_cells_and_studies_read_roles() -> None:
    impls = registry.names()
    studies = ["allocations", "paced", "l1d", "idwidth", "table_copy"]
    paper = plan_scenario("paper", impls, ("per-call", "batched"), explicit=False, quick=False, enabled=studies)
    contenders_per_call = [c for c in paper.cells if registry.record(c[0]).role == "contender" and c[1] == "per-call"]
    assert contenders_per_call and ("sglang", "per-call") not in paper.cells  # SGLang has no per-call shape
    if "sglang" in impls:
        assert ("sglang", "batched") in paper.cells
    assert all(paper.reps_of(c, 3) == 3 for c in paper.cells) and not paper.max_reps
    assert {registry.record(i).role for i, _ in paper.study_cells("paced")} == {"design"}
    assert "contender" not in {registry.record(i).role for i, _ in paper.study_cells("l1d")}
    assert ("cpp-flat", "batched") in paper.study_cells("l1d")
    assert len(paper.study_cells("allocations")) == len(paper.cells)
    # progress units: every cell's repetitions, one per cell of per-cell studies, L1D once in each implementation's
    # worker (it ticks there), id width and table copy once (the worker of none)
    workers = len({impl for impl, _ in paper.cells})
    assert workers > 1
    assert paper.units(3) == (3 * len(paper.cells) + len(paper.cells) + len(paper.study_cells("paced")) + workers
                              + 2)
    # allocations where rule 1 is in question: paper and the caching scenarios, not the other plain ones
    for scenario, counted in (("beam-search", False), ("system-prompt-256", True), ("chat-multiturn", True)):
        plan = plan_scenario(scenario, impls, ("per-call", "batched"), explicit=False, quick=False, enabled=studies)
        assert ("allocations" in plan.studies) is counted
    named = plan_scenario("beam-search", ["flat"], ("batched",), explicit=True, quick=False, enabled=studies)
    assert named.studies == ["allocations"]  # a scenario named on the command line is counted
    named = plan_scenario("paper", ["sglang"], ("per-call",), explicit=True, quick=False, enabled=[])
    assert named.reps_of(("sglang", "per-call"), 3) == 3  # what is named runs as asked


def test_the_contract_methods_are_listed_alike_in_registry_protocol_readme_and_example() -> None:
    from impls.contract import BlockManager

    methods = {**registry.CONTRACT_METHODS, **registry.OPTIONAL_METHODS}
    protocol = {name for name, value in vars(BlockManager).items() if callable(value) and not name.startswith("_")}
    assert protocol == set(methods)
    page = (ROOT / "docs" / "contract.md").read_text()
    block = page.split("# The contract", 1)[1].split("```python", 1)[1].split("```")[0]
    readme = {}
    for line in block.splitlines():
        for name in (n.strip("(") for n in line.split(".")[1:] if n):
            name = name.split("(")[0]
            if name in methods or (name.isidentifier() and line.lstrip().startswith(".")):
                readme.setdefault(name, "# optional" in line)
    assert {n for n in readme if n in methods} == set(methods)
    assert {n for n, optional in readme.items() if optional} == set(registry.OPTIONAL_METHODS)
    example = (ROOT / "examples" / "toy_block_manager" / "toy_bm" / "__init__.py").read_text()
    for name in registry.CONTRACT_METHODS:
        assert f"def {name}(" in example, f"the example plug-in lacks {name}"
