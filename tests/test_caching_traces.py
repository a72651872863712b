"""Prefix-caching traces (format 3) and scenarios: the file format, the scenarios, and their replay from Python."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.base.drivers import Prepared, compiled_step_runner, native_step_runner, run_interpreted, step_runner
from harness.base.replay import ReplayError, check_end_state, replay
from harness.cli import main
from impls import REGISTRY
from impls.contract import supports_prefix_caching
from impls.core.reference import ReferenceModel
from scenarios import SCENARIOS, ScenarioError, TraceError, generate, load, save
from scenarios.realtrace import DATA_DIR, hash_id_chain
from scenarios.trace import ALLOCATE_CACHED, OP_NAMES, SEAL, trace_uses_caching
from scenarios.trace.file_format import V2_ARRAYS, V2_HEADER_KEYS, cache_totals, checksum
from tests.one_line import one_line
from tests.registered import slow_for

CACHING = sorted(name for name, sc in SCENARIOS.items() if sc.caching)
SMALL = {  # a short version of each, with hits (chat: follow-up turns arrive from about step 130)
    "chat-multiturn": {"steps": 220},
    "tight-pool-cached": {"steps": 220, "num_blocks": 4096, "running": 64},
    "system-prompt-256": {"steps": 30},
    "system-prompt-1024": {"steps": 8},
    "mooncake-cached": {"duration_s": 20.0},
}


@pytest.fixture(scope="module")
def traces() -> dict:
    return {name: generate(name, **SMALL[name]) for name in CACHING}


class BufferedReference(ReferenceModel):
    """The reference model with the batched regime's buffer interface (``decode_step``, ``lookup``)."""

    def decode_step(self, seq_ids, cow_out, slot_out) -> int:  # type: ignore[override]
        cows, slots = super().decode_step([int(s) for s in seq_ids])
        if cows:
            cow_out[: len(cows)] = cows
        slot_out[: len(slots)] = slots
        return len(cows)

    def lookup(self, seq_ids, slot_out) -> None:
        slot_out[: len(seq_ids)] = [self.last_slot(int(s)) for s in seq_ids]


def test_the_caching_scenarios_are_catalogued() -> None:
    assert set(CACHING) == set(SMALL)
    assert not any(SCENARIOS[name].caching for name in ("paper", "shared-prefix", "mooncake", "azure-code"))


# -- the format --------------------------------------------------------------------------------------------
def test_round_trip(tmp_path, traces) -> None:
    trace = traces["chat-multiturn"]
    back = load(save(trace, tmp_path / "t.npz"))
    assert back.header == trace.header and trace_uses_caching(back)
    for name, arr in trace.arrays.items():
        assert np.array_equal(back.arrays[name], arr) and back.arrays[name].dtype == arr.dtype
    c = back.header["cache"]
    assert c["hit_tokens"] == int(back.step_hits.sum()) > 0
    assert c["seals"] == back.header["ops_by_kind"]["seal"] > 0
    bs = back.config["block_size"]
    i = int(np.flatnonzero(back.op == ALLOCATE_CACHED)[0])
    assert len(back.chain(i)) == back.a1[i] // bs and back.chain(i).dtype == np.uint64


def test_plain_traces_carry_no_caching() -> None:
    trace = generate("paper", steps=5, running=8, num_blocks=256)
    assert not trace_uses_caching(trace)
    assert len(trace.hashes) == 0 and np.all(trace.op_hash == -1) and not trace.step_hits.any()
    assert set(trace.header["cache"].values()) == {0}


def _v2_file(path, trace, **header_changes) -> None:
    """``trace`` written as format 2 wrote it."""
    header = {k: v for k, v in trace.header.items() if k in V2_HEADER_KEYS}
    header["ops_by_kind"] = {k: v for k, v in header["ops_by_kind"].items() if k not in ("allocate_cached", "seal")}
    header.update(version=2, **header_changes)
    arrays = {name: trace.arrays[name] for name in V2_ARRAYS}
    header["checksum"] = checksum(header, arrays, V2_ARRAYS)
    np.savez(path, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)


def test_format_2_files_load_as_traces_without_caching(tmp_path) -> None:
    trace = generate("beam-search", steps=12, running=16, num_blocks=512)
    _v2_file(tmp_path / "v2.npz", trace)
    back = load(tmp_path / "v2.npz")
    assert back.header == trace.header  # what the generator makes now, checksum included
    for name in trace.arrays:
        assert np.array_equal(back.arrays[name], trace.arrays[name])
    assert load(DATA_DIR / "gate-paper.npz").header["version"] == 3  # the committed format 2 file


def test_format_2_files_are_still_checked(tmp_path) -> None:
    trace = generate("paper", steps=5, running=8, num_blocks=256)
    _v2_file(tmp_path / "edited.npz", trace)
    path = tmp_path / "edited.npz"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["a0"][3] += 1
    np.savez(path, **arrays)
    with pytest.raises(TraceError, match=r"edited\.npz: checksum mismatch"):
        load(path)
    _v2_file(tmp_path / "cached.npz", trace, ops_by_kind={**trace.header["ops_by_kind"], "seal": 1})
    with pytest.raises(TraceError, match=r"cached\.npz: format 2 header counts prefix-caching ops"):
        load(tmp_path / "cached.npz")


def _edited(trace, header=None, **arrays):
    """The trace's arrays with ``arrays`` replaced, its cache totals made to agree (unless ``header`` says
    otherwise), and a recomputed checksum: only the structural checks can refuse it."""
    payload = {**trace.arrays, **arrays}
    h = json.loads(json.dumps(trace.header))
    h.update(cache_totals(payload, trace.config["block_size"]))
    h.update(header or {})
    h["checksum"] = checksum(h, payload)
    return h, payload


def _corruptions(trace) -> dict:
    bs = trace.config["block_size"]
    cached = np.flatnonzero(trace.op == ALLOCATE_CACHED)
    long = int(cached[np.argmax(trace.a1[cached])])  # a prompt with at least two full blocks
    sealed, sealed2 = np.flatnonzero(trace.op == SEAL)[:2].tolist()
    plain = int(np.flatnonzero(trace.op_hash == -1)[0])

    def put(name, i, value, j=None, other=None):
        arr = trace.arrays[name].copy()
        arr[i] = value
        if j is not None:
            arr[j] = other
        return {name: arr}

    dup = trace.hashes.copy()
    dup[trace.op_hash[long] + 1] = dup[trace.op_hash[long]]
    return {
        "index past the end": (put("op_hash", sealed, len(trace.hashes)), "outside the hashes"),
        "negative index": (put("op_hash", long, -5), "outside the hashes"),
        "index on a plain op": (put("op_hash", plain, 0), "must be -1"),
        "hash 0": (put("hashes", int(trace.op_hash[long]), 0), "hash of 0"),
        "hash twice in a chain": ({"hashes": dup}, "twice"),
        "chain past the end": (put("op_hash", long, len(trace.hashes) - 1), "outside the hashes"),
        "seal answer 2": (put("a1", sealed, 2, sealed2, int(trace.a1[sealed] + trace.a1[sealed2]) - 2), "seal ops"),
        "op code 9": (put("op", plain, 9), "unknown op code"),
        "hits not whole blocks": (put("step_hits", 0, 3, 1, int(trace.step_hits[1]) + bs - 3), "whole blocks"),
        "negative evictions": (put("step_evictions", 0, -1, 1, int(trace.step_evictions[1]) + 1), "step_evictions"),
        "flag off": ({"__header__": {"prefix_caching": False}}, "without prefix caching"),
        "totals off": ({"__header__": {"cache": {**trace.header["cache"], "seals": 1}}}, "cache"),
    }


def test_corrupted_caching_traces_are_refused(tmp_path, traces) -> None:
    trace = traces["chat-multiturn"]
    for what, (change, needle) in _corruptions(trace).items():
        header, arrays = _edited(trace, change.pop("__header__", None), **change)
        path = tmp_path / f"{what.replace(' ', '-')}.npz"
        np.savez(path, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
        with pytest.raises(TraceError) as info:
            load(path)
        one_line(info.value, path, needle)


def test_a_missing_format_3_array_is_refused(tmp_path, traces) -> None:
    trace = traces["system-prompt-256"]
    arrays = {k: v for k, v in trace.arrays.items() if k != "op_hash"}
    np.savez(tmp_path / "t.npz", header=np.frombuffer(json.dumps(trace.header).encode(), np.uint8), **arrays)
    with pytest.raises(TraceError, match="missing array 'op_hash'"):
        load(tmp_path / "t.npz")


# -- the scenarios -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CACHING)
def test_scenarios_are_deterministic_and_hit(traces, name: str) -> None:
    trace = traces[name]
    again = generate(name, **SMALL[name])
    assert again.header["checksum"] == trace.header["checksum"]
    assert trace_uses_caching(trace) and trace.header["cache"]["hit_tokens"] > 0
    assert trace.header["ops_by_kind"]["allocate"] == 0  # every admission goes through the cache
    if name != "mooncake-cached":  # a real trace: the seed draws nothing
        other = generate(name, **SMALL[name], seed=1)
        assert other.header["checksum"] != trace.header["checksum"]


def test_chat_turns_hit_the_sealed_answers(traces) -> None:
    """A follow-up turn's prompt chain holds the hashes its previous turn's decode sealed."""
    trace = traces["chat-multiturn"]
    sealed = {int(trace.chain(i)[0]) for i in np.flatnonzero(trace.op == SEAL)}
    later = {int(h) for i in np.flatnonzero(trace.op == ALLOCATE_CACHED) for h in trace.chain(i)}
    assert len(sealed & later) > 100


def test_system_prompt_hits_every_admission_but_the_first(traces) -> None:
    trace = traces["system-prompt-256"]
    bs = trace.config["block_size"]
    admissions = trace.header["ops_by_kind"]["allocate_cached"]
    assert trace.header["cache"]["hit_tokens"] == (admissions - 1) * 1024 and 1024 % bs == 0


def test_tight_pool_evicts_as_its_description_says() -> None:
    trace = generate("tight-pool-cached")
    evictions = trace.step_evictions
    first = int(np.flatnonzero(evictions)[0])
    assert trace.header["cache"]["evictions"] > 0 and trace.header["preemptions"] == 0
    assert np.all(evictions[first:] > 0)  # once the never-cached blocks are gone, every step evicts
    description = SCENARIOS["tight-pool-cached"].description
    assert f"step {first})" in description
    assert f"{round(evictions.mean())} evictions per step" in description


def test_mooncake_chain_follows_the_hash_ids() -> None:
    """Blocks of whole 512-token chunks come from the ids (equal ids, equal hashes); a partial chunk's blocks
    and everything after are the request's own."""
    a = hash_id_chain(np.array([0, 1, 2]), 1100, 16, 512, unique=7)
    b = hash_id_chain(np.array([0, 1, 2, 3]), 1600, 16, 512, unique=8)
    c = hash_id_chain(np.array([0, 9]), 1024, 16, 512, unique=9)
    assert len(a.hashes) == 64 and len(b.hashes) == 96 and len(c.hashes) == 64
    assert a.blocks(64) == b.blocks(64) and a.hash(64) != b.hash(64)  # chunk 2 is partial in a
    assert c.blocks(32) == a.blocks(32) and c.hash(32) != a.hash(32)
    assert len(set(b.blocks(96))) == 96 and 0 not in b.blocks(96)


def test_a_csv_without_hash_ids_is_refused_for_caching(tmp_path) -> None:
    with pytest.raises(ScenarioError, match=r"azure_code_2023\.csv: no 'hash_ids' column; prefix caching needs"):
        generate("mooncake-cached", csv="azure_code_2023.csv", duration_s=10)
    csv = tmp_path / "short.csv"
    csv.write_text("timestamp,prompt_tokens,output_tokens,hash_ids\n0,1000,4,0 1\n1,600,4,0\n")
    with pytest.raises(ScenarioError, match=r"short\.csv: line 3, column 'hash_ids': 1 ids for 600 prompt tokens"):
        generate("mooncake-cached", csv=str(csv))


# -- replay ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", slow_for(CACHING, {"mooncake-cached"}))
def test_replay_reproduces_hits_seals_and_end_state(traces, name: str) -> None:
    trace = traces[name]
    prep = Prepared.from_trace(trace)
    for regime in ("per-call", "batched"):
        mgr = BufferedReference(**trace.config)
        assert replay(trace, mgr, regime) == trace.header["cow_count"]
        check_end_state(trace, mgr)
        mgr = BufferedReference(**trace.config)
        half = trace.num_steps // 2
        times = [run_interpreted(prep, mgr, regime, 0, half), run_interpreted(prep, mgr, regime, half)]
        for lo, part in zip((0, half), times, strict=True):
            part.check(prep.trace.step_cows, prep.slot_digests, lo)
        check_end_state(trace, mgr)
        assert mgr.evictions == trace.header["cache"]["evictions"]
        assert times[0].ns[:, 0].sum() > 0  # allocate_cached is timed as alloc
    for cls in REGISTRY.values():  # the designs with prefix caching, as they join the registry
        if supports_prefix_caching(cls):
            mgr = cls(**trace.config)
            replay(trace, mgr, "batched")
            check_end_state(trace, mgr)


class WrongHits(BufferedReference):
    def allocate_cached(self, seq, num_tokens, hashes) -> int:
        return super().allocate_cached(seq, num_tokens, hashes) + self.block_size


class WrongSeal(BufferedReference):
    def seal(self, seq, block_hash) -> bool:
        return not super().seal(seq, block_hash)


@pytest.mark.parametrize("cls, needle", [(WrongHits, "the cache served"), (WrongSeal, "seal(")])
def test_replay_catches_wrong_answers(traces, cls, needle: str) -> None:
    trace = traces["chat-multiturn"]
    prep = Prepared.from_trace(trace)
    with pytest.raises(ReplayError, match=needle.replace("(", r"\(")):
        replay(trace, cls(**trace.config))
    with pytest.raises(ReplayError, match=needle.replace("(", r"\(")):
        run_interpreted(prep, cls(**trace.config), "batched")
    with pytest.raises(ReplayError, match=needle.replace("(", r"\(")):
        step_runner(prep, cls(**trace.config), "per-call")(0, trace.num_steps)


def test_managers_and_drivers_without_caching_are_refused(traces) -> None:
    trace = traces["system-prompt-256"]
    prep = Prepared.from_trace(trace)
    plain = REGISTRY["dict"](**trace.config)
    for attempt in (lambda: replay(trace, plain), lambda: run_interpreted(prep, plain, "batched"),
                    lambda: step_runner(prep, plain, "batched")):
        with pytest.raises(ReplayError, match="DictBlockManager has no prefix caching"):
            attempt()
    assert plain.num_free_blocks() == trace.config["num_blocks"]  # refused before any call
    mgr = BufferedReference(**trace.config)
    with pytest.raises(ReplayError, match="compiled driver of BufferedReference does not replay prefix-caching ops"):
        compiled_step_runner(prep, mgr, drive=None)
    with pytest.raises(ReplayError, match="native driver of BufferedReference does not replay prefix-caching ops"):
        native_step_runner(prep, mgr)(0, 1)


# -- the command line --------------------------------------------------------------------------------------
def test_cli_lists_and_shows_caching(tmp_path, capsys) -> None:
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CACHING)
    path = tmp_path / "chat.npz"
    assert main(["trace", "chat-multiturn", "--steps", "200", "--running", "64", "-o", str(path)]) == 0
    assert main(["trace", "--show", str(path)]) == 0
    out = capsys.readouterr().out
    for key in ("prefix caching", "cache hit tokens", "cache hit blocks", "cache evictions", "cache seals"):
        assert key in out
    assert OP_NAMES[SEAL] in out


def test_cli_imports_a_csv_with_hash_ids(tmp_path, capsys) -> None:
    csv = tmp_path / "mine.csv"
    rows = "".join(f"{i},{600 + 40 * i},{4 + i % 3},0 {1 + i}{' 99' if 600 + 40 * i > 1024 else ''}\n"
                   for i in range(20))
    csv.write_text("timestamp,prompt_tokens,output_tokens,hash_ids\n" + rows)
    out = tmp_path / "mine.npz"
    assert main(["trace", "--from-csv", str(csv), "--prefix-caching", "true", "--concurrency", "4",
                 "--num-blocks", "4096", "-o", str(out)]) == 0
    trace = load(out)
    assert trace_uses_caching(trace) and trace.header["cache"]["hit_tokens"] > 0  # chunk 0 is shared
    plain = tmp_path / "plain.csv"
    plain.write_text("timestamp,prompt_tokens,output_tokens\n0,100,4\n")
    assert main(["trace", "--from-csv", str(plain), "--prefix-caching", "true", "-o", str(tmp_path / "p.npz")]) == 2
    err = capsys.readouterr().err
    assert "plain.csv: no 'hash_ids' column" in err and "--prefix-caching false" in err
