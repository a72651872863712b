"""Scenarios: every one generates, saves, loads and replays identically on every implementation."""

from __future__ import annotations

import numpy as np
import pytest

from harness.base.replay import check_end_state, replay
from harness.run.matrix import SCALE_ONLY, matches
from impls import REGISTRY
from scenarios import SCENARIOS, ScenarioError, generate, load, read_requests_csv, save
from tests.registered import slow_for

SHARING = {"shared-prefix", "parallel-sampling", "beam-search"}
REAL = {"azure-code", "mooncake", "mooncake-cached"}
PLAIN = sorted(name for name, sc in SCENARIOS.items() if not sc.caching)  # prefix caching: test_caching_traces.py
# The scale sweeps' big points (pools of up to a million blocks, thousands of sequences: minutes on every
# implementation) replay in the slow suite; their smallest points, and the first with uint32 ids, in the default.
SCALE_SLOW = {n for n in PLAIN if matches(n, SCALE_ONLY)} - {"context-4096", "pool-16384", "pool-131072"}


def small(name: str, **extra):
    """A short version of each scenario, so the whole catalogue replays in seconds."""
    if name in REAL:
        return generate(name, duration_s=40, **extra)
    if name == "long-context":
        return generate(name, steps=60, **extra)
    return generate(name, steps=40, **extra)


class Traces(dict):
    """Each scenario's short trace, saved and loaded back, made when a test first asks for it."""

    def __init__(self, folder) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str):
        self[name] = load(save(small(name), self.folder / f"{name}.npz"))
        return self[name]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Traces:
    return Traces(tmp_path_factory.mktemp("traces"))


# sglang (torch on CPU, ~100x slower per call than the others) replays these in the default suite; every other
# scenario in the slow one.
TORCH_QUICK = {"paper", "parallel-sampling", "beam-search", "pressure"}


# The two slowest replays of the rest also go to the slow suite, so that `make test` stays under its 10 minutes.
REPLAY_SLOW = {"pool-131072", "beam-search", "concurrency-1024", "mooncake"}


@pytest.mark.parametrize("name", slow_for(sorted(set(PLAIN) - SCALE_SLOW), REPLAY_SLOW))
def test_every_scenario_replays_on_every_implementation(traces, name: str) -> None:
    _replay_all(traces[name], [i for i in REGISTRY if i != "sglang" or name in TORCH_QUICK])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCALE_SLOW))
def test_every_scale_scenario_replays_on_every_implementation(traces, name: str) -> None:
    _replay_all(traces[name], [i for i in REGISTRY if i != "sglang"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(PLAIN) - TORCH_QUICK - SCALE_SLOW))
def test_every_scenario_replays_on_sglang(traces, name: str) -> None:
    if "sglang" not in REGISTRY:
        pytest.skip("sglang needs torch (pip install -e '.[torch]')")
    _replay_all(traces[name], ["sglang"])


def _replay_all(trace, impls: list[str]) -> None:
    for impl in impls:
        cls = REGISTRY[impl]
        for regime in ("per-call", "batched"):
            mgr = cls(**trace.config)
            cows = replay(trace, mgr, regime)
            assert cows == trace.header["cow_count"], (impl, regime)
            check_end_state(trace, mgr)


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - SCALE_SLOW))
def test_trace_properties(traces, name: str) -> None:
    trace = traces[name]
    h = trace.header
    assert h["peak_blocks_in_use"] <= h["config"]["num_blocks"]
    assert h["live_at_end"] == int(np.count_nonzero(trace.final_lens))
    if name in REAL:
        assert h["live_at_end"] == 0  # every request in the window ran to completion
    if name in SHARING:
        assert h["cow_count"] > 0
    if name == "paper":
        assert h["cow_count"] == 0
        assert set(trace.running_per_step().tolist()) == {256}


def test_shared_prefix_reaches_ref_counts_in_the_hundreds() -> None:
    trace = generate("shared-prefix", steps=5)
    mgr = REGISTRY["list"](**trace.config)
    replay(trace, mgr)
    root_block = mgr.block_table(0)[0]
    assert mgr.ref_count(root_block) > 200


def test_pressure_preempts_and_recomputes() -> None:
    trace = generate("pressure", steps=300)
    assert trace.header["preemptions"] > 0
    assert trace.header["peak_blocks_in_use"] == trace.header["config"]["num_blocks"]


def test_generation_is_deterministic() -> None:
    a, b = generate("beam-search", steps=30), generate("beam-search", steps=30)
    c = generate("beam-search", steps=30, seed=1)
    assert a.header["checksum"] == b.header["checksum"] != c.header["checksum"]


@pytest.mark.parametrize("name, window", [("azure-code", (0.0, 60.0)), ("mooncake", (30.0, 30.0))])
def test_real_trace_keeps_every_request_of_its_window(name: str, window) -> None:
    start, duration = window
    trace = generate(name, start_s=start, duration_s=duration)
    df = read_requests_csv(SCENARIOS[name].defaults["csv"])
    expected = int(((df.timestamp >= start) & (df.timestamp < start + duration)).sum())
    assert trace.header["num_requests"] == expected > 0
    admitted = trace.header["ops_by_kind"]["allocate"] - trace.header["preemptions"]
    assert admitted == expected


@pytest.mark.parametrize(
    "name, params, match",
    [
        ("paper", {"prompt_mean": 10_000}, "does not fit"),
        ("paper", {"max_blocks_per_seq": 70_000}, "exceeds the pool"),
        ("paper", {"running": 0}, "must be positive"),
        ("paper", {"steps": "many"}, "takes a int"),
        ("paper", {"nonsense": 1}, "no parameter"),
        ("shared-prefix", {"num_blocks": 300, "steps": 20}, "pool"),
        ("azure-code", {"max_blocks_per_seq": 4}, "line"),
        ("azure-code", {"start_s": 1e9}, "no request"),
        ("nonexistent", {}, "unknown scenario"),
    ],
)
def test_impossible_parameters_are_refused(name: str, params: dict, match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        generate(name, **params)
