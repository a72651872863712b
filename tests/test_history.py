"""``kvblock-bench history``: the VERSIONS parser, the plans' release table and its refusals, the verdicts, and whole
runs on stand-in vLLM wheels laid out as three ranges of releases are (``tests/history_standin.py``).

The real releases (downloads of 300 MB each for vLLM) run in the slow test at the end."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version

from harness.cli import main
from harness.engines import lmdeploy_engine, sglang_engine, tvm_engine, vllm_engine
from harness.engines.catalog import ENGINES, TVM_CACHING
from harness.engines.eras import Era, era_of
from harness.errors import InputError
from harness.history.records import CALL_METRICS, METRICS, HistoryRow, read_history, write_history
from harness.history.releases import parse_versions, resolve
from harness.history.render import render
from harness.history.verdicts import paired_steps, step, steps
from tests.history_standin import LAYOUTS, PUBLISHED_VLLM, vllm_wheels
from tests.lmdeploy_standin import LAYOUTS as LMDEPLOY_LAYOUTS
from tests.lmdeploy_standin import lmdeploy_wheels

SMALL = ["--steps", "24", "--running", "12", "--num-blocks", "2048", "--prompt-mean", "40", "--output-mean", "30"]


# -- VERSIONS ----------------------------------------------------------------------------------------------
def test_a_comma_list_is_sorted_by_release_and_a_range_keeps_its_ends() -> None:
    assert parse_versions("0.24.0, 0.23.0,0.24.0,0.9.2") == (["0.9.2", "0.23.0", "0.24.0"], None)
    assert parse_versions("0.21.0..0.33.0") == ([], ("0.21.0", "0.33.0"))
    assert parse_versions("0.5.15.post1") == (["0.5.15.post1"], None)


@pytest.mark.parametrize("text, words", [
    ("0.21..", "'' is not a release number"), ("latest", "'latest' is not a release number"),
    ("0.3..0.2", "runs backwards"), ("0.1,,0.2", "'' is not a release number"),
    ("0.21.0..0.22.0,0.3", "'0.22.0,0.3' is not a release number"), ("0.2 3", "not a release number"),
])
def test_bad_versions_are_one_line_naming_the_part(text, words) -> None:
    with pytest.raises(InputError, match=re.escape(words)):
        parse_versions(text)


def test_a_range_is_every_release_the_index_lists_between_its_ends(tmp_path) -> None:
    links = vllm_wheels(tmp_path, {"0.22.1": (False, False, False), "0.25.1": (True, False, False),
                                   "0.26.0": (True, True, False), "0.27.0": (True, True, False)})
    assert resolve("0.22.1..0.26.0", "vllm", links) == ["0.22.1", "0.25.1", "0.26.0"]
    assert resolve("0.26.0,0.22.1", "vllm", links) == ["0.22.1", "0.26.0"]  # a list is not looked up
    with pytest.raises(InputError, match=re.escape("0.23.0 is not a published release")):
        resolve("0.23.0..0.26.0", "vllm", links)


# -- the plans' table of releases --------------------------------------------------------------------------
@pytest.mark.parametrize("module", [vllm_engine, sglang_engine, lmdeploy_engine, tvm_engine])
def test_the_eras_are_ordered_and_disjoint_and_each_release_finds_its_own(module) -> None:
    eras = module.ERAS
    for era in eras:
        assert Version(era.first) <= Version(era.last) and era.moved
        assert module.era(era.first) is era and module.era(era.last) is era
    for a, b in itertools.pairwise(eras):
        assert Version(a.last) < Version(b.first)
    assert module.era(None) is eras[-1] and module.era("0123abcd" * 5) is eras[-1]  # a checkout: the newest


def test_the_vllm_eras_drive_what_moved_between_releases() -> None:
    assert vllm_engine.era("0.16.0").drive["eos_token_id"] and not vllm_engine.era("0.17.0").drive["eos_token_id"]
    assert "vllm.utils.mem_constants" in vllm_engine.plan("0.13.0").stubs
    assert vllm_engine.era("0.22.1").drive["scheduler_block_size"] is False
    assert vllm_engine.era("0.23.0").drive["scheduler_block_size"] is True
    assert vllm_engine.era("0.25.1").drive["computed"]((["b"], 16)) == (["b"], 16)
    with pytest.raises(ValueError):  # a third value where the era expects two: never read past it
        vllm_engine.era("0.25.1").drive["computed"]((["b"], 16, 0))
    assert vllm_engine.era("0.26.0").drive["computed"]((["b"], 16, 0)) == (["b"], 16)
    assert vllm_engine.plan("0.27.0").stubs["vllm.envs"] == {"VLLM_PREFIX_CACHE_RETENTION_INTERVAL": None}
    assert vllm_engine.plan("0.29.0").stubs["vllm.envs"] == {}
    assert "vllm.utils.gc_utils" in vllm_engine.plan("0.34.0").real
    assert "vllm.utils.gc_utils" not in vllm_engine.plan("0.33.0").real


def test_the_lmdeploy_eras_hand_each_release_the_sequence_its_block_manager_reads() -> None:
    old, middle, new = (lmdeploy_engine.era(v).drive["sequence"] for v in ("0.9.2.post1", "0.11.1", "0.12.0"))
    assert lmdeploy_engine.era("0.10.0").drive["sequence"] is old
    assert lmdeploy_engine.era("0.18.0").drive["sequence"] is new
    assert hasattr(old, "num_all_tokens") and hasattr(old, "num_all_cross_tokens")
    assert not hasattr(middle, "num_all_tokens") and hasattr(middle, "num_all_cross_tokens")
    assert not hasattr(new, "num_all_cross_tokens")
    # 0.9.2's allocate checks isinstance(seq, SchedulerSequence): the stand-in messages module names the era's class
    assert lmdeploy_engine.plan("0.9.2").stubs["lmdeploy.pytorch.messages"]["SchedulerSequence"] is old


def test_the_lmdeploy_eras_drive_the_trie_module_before_0_16_0_and_the_package_from_it() -> None:
    """Every release the plans span has a caching-on baseline: the module block_trie.py up to 0.15.0 (its cursor on
    the table up to 0.13.0, in seq.prefix_cache from 0.14.0, which also logs), the package from 0.16.0."""
    layouts = {v: lmdeploy_engine.era(v).drive["trie"] for v in ("0.9.2", "0.13.0", "0.14.0", "0.15.0", "0.16.0")}
    assert layouts == {"0.9.2": "table", "0.13.0": "table", "0.14.0": "prefix_cache", "0.15.0": "prefix_cache",
                       "0.16.0": "package"}
    module = "lmdeploy.pytorch.paging.block_trie"
    assert lmdeploy_engine.plan("0.13.0").real[-1] == module and "lmdeploy.utils" not in lmdeploy_engine.plan(
        "0.13.0").stubs
    assert "lmdeploy.utils" in lmdeploy_engine.plan("0.14.0").stubs
    assert "lmdeploy.pytorch.config" in lmdeploy_engine.plan("0.15.0").stubs
    assert f"{module}.trie" in lmdeploy_engine.plan("0.16.0").real
    assert f"{module}.trie" not in lmdeploy_engine.plan("0.15.0").real


def test_every_published_vllm_release_the_plans_span_has_a_plan() -> None:
    """0.15.1 (only the hybrid coordinator and the scheduler changed from 0.15.0) fell between two rows."""
    assert [vllm_engine.era(v).first for v in PUBLISHED_VLLM].count("0.14.0") == 4  # 0.14.0 to 0.15.1


@pytest.mark.parametrize("engine, version, words", [
    ("vllm", "0.11.2", "older than the plans drive (0.12.0..0.34.0): before 0.12.0 KVCacheManager takes no"),
    ("vllm", "0.35.0", "newer than 0.34.0, the last release the import plans were checked against"),
    ("sglang", "0.5.21", "launch Triton kernels"),
    ("lmdeploy", "0.9.1", "older than the plans drive (0.9.2..0.18.0): releases before 0.9.2 were not read"),
    ("lmdeploy", "0.19.0", "newer than 0.18.0, the last release the import plans were checked against"),
])
def test_a_release_outside_the_plans_is_refused_saying_why(engine, version, words) -> None:
    module = {"vllm": vllm_engine, "sglang": sglang_engine, "lmdeploy": lmdeploy_engine}[engine]
    with pytest.raises(InputError, match=re.escape(words)):
        module.era(version)


def test_a_gap_between_eras_is_refused() -> None:
    eras = (Era("1.0", "1.2", "first"), Era("2.0", "2.1", "second"))
    assert era_of(eras, "x", "1.1", "old").first == "1.0"
    with pytest.raises(InputError, match="between the plans' ranges"):
        era_of(eras, "x", "1.5", "old")


# -- verdicts and the figure -------------------------------------------------------------------------------
def _row(version: str, value: float, metric: str = "seq_step_ns", caching: str = "off", width: float = 0.02,
         status: str = "ok") -> HistoryRow:
    return HistoryRow("vllm", version, caching, "paper", metric, value, value * (1 - width), value * (1 + width),
                      status, 5, 100, "sha256:x", "machine", "0.1-0.1", "now", "cmd", "how")


def test_each_release_is_compared_with_the_one_before_as_compare_judges() -> None:
    rows = [_row("0.24.0", 130.0), _row("0.10.0", 100.0), _row("0.23.0", 100.0), _row("0.25.0", 100.0),
            _row("0.26.0", 103.0)]
    found = steps(rows)
    assert [(s.base, s.new, s.verdict) for s in found] == [
        ("0.10.0", "0.23.0", "no difference"), ("0.23.0", "0.24.0", "slower"), ("0.24.0", "0.25.0", "faster"),
        ("0.25.0", "0.26.0", "slower, under the threshold")]  # 1.03x, its interval wholly above 1
    assert math.isclose(found[1].ratio, 1.3) and found[1].ci_low > 1.1
    assert "less than the 10 % threshold" in found[3].note
    wide = step(_row("1.0", 100.0), _row("1.1", 130.0, width=0.3))
    assert wide.verdict == "no difference" and "inconclusive" in wide.note
    failed = step(_row("1.0", 100.0), _row("1.1", math.nan, status="failed"))
    assert failed.verdict == "not comparable" and "1.1" in failed.note


def test_render_writes_the_verdicts_the_table_and_a_figure(tmp_path) -> None:
    rows = [_row(v, x, m, c) for m in METRICS + CALL_METRICS for c in ("off", "on")
            for v, x in (("0.23.0", 100.0), ("0.24.0", 150.0))]
    write_history(tmp_path / "history.csv", rows)
    assert read_history(tmp_path / "history.csv") == rows
    lines = render(tmp_path)
    with (tmp_path / "verdicts.csv").open() as fh:
        verdicts = list(csv.DictReader(fh))
    assert len(verdicts) == 2 * len(METRICS) and {v["verdict"] for v in verdicts} == {"slower"}
    assert "| vllm 0.23.0 -> 0.24.0 | on | paper | 1.50" in (tmp_path / "history.md").read_text()
    md = (tmp_path / "history.md").read_text()
    assert "| vllm 0.24.0 | off | paper | 150 [147-153] | 150 [147-153] | 50 % |" in md
    assert (tmp_path / "history-vllm.png").stat().st_size > 0 and (tmp_path / "history-vllm.svg").is_file()
    assert any(line.startswith("slower: vllm 0.24.0 (off, paper, seq_step_ns x1.50)") for line in lines)


def _raw(folder, version: str, per_rep, caching: dict | None = None) -> None:
    """A release's runs/ file: its baseline's step times per repetition (and which caching mode it replays)."""
    doc = {"step_ns": {"caching off": [list(map(float, r)) for r in per_rep]},
           **({"caching": caching} if caching is not None else {})}
    (folder / "runs").mkdir(exist_ok=True)
    (folder / "runs" / f"vllm-{version}__paper.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_seq_step_verdicts_pair_the_repetitions_the_releases_ran_side_by_side(tmp_path) -> None:
    """Each repetition's load 1x to 2x, the same for both releases (they ran in lockstep): their own intervals are
    wide and the step inconclusive; paired over repetitions 0.24.0 is 8 % slower, decided. A folder whose runs/
    do not say the caching mode (or have none) keeps the independent verdict."""
    rng = np.random.default_rng(4)
    load = np.exp(rng.uniform(0, np.log(2), size=(5, 1)))
    base = 100 * load * np.exp(rng.normal(0, 0.01, size=(5, 50)))
    new = 108 * load * np.exp(rng.normal(0, 0.01, size=(5, 50)))
    rows = [_row("0.23.0", 100.0, width=0.4), _row("0.24.0", 108.0, width=0.4)]
    for version, times in (("0.23.0", base), ("0.24.0", new)):
        _raw(tmp_path, version, times, {"caching off": "off"})
    (found,) = steps(rows, paired=paired_steps(tmp_path, rows))
    assert found.interval == "paired" and found.ci_low > 1.0 and found.ci_high < 1.1 and abs(found.ratio - 1.08) < 0.01
    (alone,) = steps(rows)
    assert alone.interval == "independent" and "inconclusive" in alone.note
    _raw(tmp_path, "0.24.0", new)  # no caching mode: not paired
    assert paired_steps(tmp_path, rows) == {}


# -- whole runs on stand-in wheels -------------------------------------------------------------------------
def _history(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["history", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _stand_in_history(capsys, tmp_path: Path, engine: str, versions: str, links: Path) -> tuple[Path, str, str]:
    """``history`` of stand-in wheels at ``links`` on a small ``paper``, 2 repetitions; (out folder, stdout, stderr)."""
    out = tmp_path / "out"
    code, stdout, err = _history(capsys, engine, versions, "--scenario", "paper", "--reps", "2", "--out", str(out),
                                 "--cache", str(tmp_path / "cache"), "--find-links", str(links), *SMALL)
    assert code == 0, err
    return out, stdout, err


@pytest.mark.slow  # an end-to-end history run over four ranges (make test-slow, .ci/run)
def test_history_drives_four_ranges_of_releases_in_lockstep_and_checks_each_replay(tmp_path, capsys) -> None:
    out, stdout, err = _stand_in_history(capsys, tmp_path, "vllm", "0.16.0..0.26.0", vllm_wheels(tmp_path))
    rows = read_history(out / "history.csv")
    assert {(r.version, r.caching, r.metric) for r in rows} == {
        (v, c, m) for v in LAYOUTS for c in ("off", "on") for m in METRICS + CALL_METRICS}
    for r in rows:
        assert r.status == "ok" and r.reps == 2 and r.steps == 24 and r.digest.startswith("sha256:")
        assert 0 < r.ci_low <= r.value <= r.ci_high or r.metric == "alloc_ns"
        assert "lockstep" in r.how and "vllm.v1.core.kv_cache_manager" in r.how
    calls = [r for r in rows if r.metric == "engine_calls_ns"]
    assert calls and all("`manager`" in r.how and "min-max" in r.how for r in calls)  # the engine's KVCacheManager
    assert "engine calls and shared" in stdout and "| vllm 0.26.0 | on | paper |" in (out / "history.md").read_text()
    assert "vllm 0.25.1 -> 0.26.0" in stdout and "releases (" in stdout
    assert (out / "runs" / "vllm-0.25.1__paper.json.gz").is_file() and (out / "history-vllm.png").is_file()
    assert "4 releases in the cache" in err


@pytest.mark.slow  # an end-to-end history run over three of LMDeploy's ranges (make test-slow, .ci/run)
def test_history_drives_lmdeploy_s_ranges_of_releases(tmp_path, capsys) -> None:
    out, stdout, _ = _stand_in_history(capsys, tmp_path, "lmdeploy", "0.10.0..0.15.0", lmdeploy_wheels(tmp_path))
    rows = read_history(out / "history.csv")
    assert {(r.version, r.caching) for r in rows} == {(v, "off") for v in LMDEPLOY_LAYOUTS}
    assert all(r.status == "ok" and "default_block_manager" in r.how for r in rows)
    assert "lmdeploy 0.12.0 -> 0.15.0" in stdout


@pytest.mark.slow  # an end-to-end history run over two of LMDeploy's releases, two scenarios (make test-slow, .ci/run)
def test_history_measures_lmdeploy_s_trie_in_the_module_and_in_the_package(tmp_path, capsys) -> None:
    """Caching off on the plain trace, caching on (the trie) on the caching trace, for both releases: 0.15.0 with
    the trie module block_trie.py (built from a cache config and the block manager), 0.16.0 with the package."""
    out = tmp_path / "out"
    links = lmdeploy_wheels(tmp_path, {"0.15.0": "limit", "0.16.0": "limit"})
    code, _, err = _history(capsys, "lmdeploy", "0.15.0,0.16.0", "--scenario", "paper,system-prompt-256",
                            "--reps", "2", "--out", str(out), "--cache", str(tmp_path / "cache"),
                            "--find-links", str(links), *SMALL)
    assert code == 0, err
    rows = read_history(out / "history.csv")
    assert {(r.version, r.caching, r.scenario) for r in rows} == {
        ("0.15.0", "off", "paper"), ("0.16.0", "off", "paper"), ("0.15.0", "on", "system-prompt-256"),
        ("0.16.0", "on", "system-prompt-256")}
    assert all(r.status == "ok" for r in rows)
    assert all("block_trie" in r.how for r in rows if r.caching == "on")
    on = {r.version: r.how for r in rows if r.caching == "on" and r.metric == "seq_step_ns"}
    assert "lmdeploy.pytorch.config" in on["0.15.0"] and "block_trie.trie" not in on["0.15.0"]
    assert "block_trie.trie" in on["0.16.0"] and "lmdeploy.pytorch.config" not in on["0.16.0"]


def test_history_replays_forks_by_default_only_for_an_engine_that_forks() -> None:
    """TVM forks in its own runtime (fork_sequence): its history replays the calibration's fork scenario too."""
    assert ENGINES["tvm"].history_scenarios() == ["paper", "parallel-sampling"]
    assert ENGINES["vllm"].history_scenarios() == ["paper", "system-prompt-256"]
    assert ENGINES["sglang"].history_scenarios() == ["paper"]


@pytest.mark.slow  # an end-to-end history run over two of TVM's eras (make test-slow, .ci/run)
def test_history_drives_tvm_s_runtimes_each_with_its_own_companion_wheel(tmp_path, capsys) -> None:
    """0.25.0.post1 (apache-tvm-ffi 0.1.12, no length getter) and 0.27.0 (0.1.15.post2), on stand-in wheels: each
    release fetched with its era's companion, both scenarios by default, caching off and said why in every row."""
    from tests.tvm_standin import write_wheels

    links = tmp_path / "wheels"
    write_wheels(links, "attention_kv_cache_get_sequence_length", version="0.25.0.post1", ffi="0.1.12")
    write_wheels(links, version="0.27.0")
    out = tmp_path / "out"
    code, stdout, err = _history(capsys, "tvm", "0.25.0.post1,0.27.0", "--reps", "2", "--out", str(out), "--cache",
                                 str(tmp_path / "cache"), "--find-links", str(links), *SMALL)
    assert code == 0, err
    rows = read_history(out / "history.csv")
    assert {(r.version, r.caching, r.scenario) for r in rows} == {
        (v, "off", s) for v in ("0.25.0.post1", "0.27.0") for s in ("paper", "parallel-sampling")}
    assert all(r.status == "ok" and r.how.startswith(f"page bookkeeping: {TVM_CACHING}") for r in rows)
    digests = {r.version: r.digest for r in rows}
    assert all(d.count("sha256:") == 2 for d in digests.values()) and len(set(digests.values())) == 2
    releases = json.loads((out / "meta.json").read_text())["releases"]
    assert [("apache_tvm_ffi-0.1.12" in r["wheel"], r["era"]) for r in releases] == [
        (True, "0.25.0..0.25.0.post1"), (False, "0.27.0..0.27.0.post1")]
    assert "tvm 0.25.0.post1 -> 0.27.0" in stdout


@pytest.mark.slow  # an end-to-end run, ~10 s (make test-slow, .ci/run)
def test_a_release_whose_code_moved_from_its_era_fails_its_replays_and_is_not_guessed(tmp_path, capsys,
                                                                                       monkeypatch) -> None:
    links = vllm_wheels(tmp_path, {"0.25.1": (True, False, False), "0.26.0": (True, False, False)})  # as 0.25.1
    monkeypatch.chdir(tmp_path)  # without --out: a new folder in results/
    code, stdout, err = _history(capsys, "vllm", "0.25.1,0.26.0", "--scenario", "paper", "--reps", "1", "--cache",
                                 str(tmp_path / "cache"), "--find-links", str(links), *SMALL)
    assert code == 1
    [out] = (tmp_path / "results").glob("*-history-vllm")
    assert "not enough values to unpack" in err and "0.26.0" in err
    rows = read_history(out / "history.csv")
    assert {r.status for r in rows if r.version == "0.26.0"} == {"failed"}
    assert {r.status for r in rows if r.version == "0.25.1"} == {"ok"}
    assert "n/c" in stdout


@pytest.mark.parametrize("args, message", [
    (["nano-vllm", "0.1.0"], "history compares published releases of vllm, sglang, lmdeploy or tvm"),
    (["tvm", "0.24.0,0.25.0"], "tvm 0.24.0: older than the plans drive (0.25.0..0.27.0.post1)"),
    (["vllm", "0.11.2,0.12.0"], "vllm 0.11.2: older than the plans drive"),
    (["sglang", "0.5.21,0.5.22"], "sglang 0.5.21: older than the plans drive (0.5.22..0.5.23): before 0.5.22"),
    (["vllm", "latest"], "VERSIONS latest: 'latest' is not a release number"),
    (["vllm", "0.23.0,0.24.0", "--scenario", "nope"], "--scenario nope: unknown scenario"),
    (["vllm", "0.23.0,0.24.0", "--reps", "0"], "--reps"),
    (["vllm", "0.23.0,0.24.0", "--group", "1"], "--group 1: a group holds the anchor and at least one release"),
    (["vllm", "0.23.0,0.24.0", "--group", "-2"], "--group"),
    (["vllm", "0.23.0,0.24.0", "--anchor", "0.25.0"], "--anchor 0.25.0: not one of the releases VERSIONS names"),
])
def test_bad_history_input_is_one_line_and_exit_status_2(tmp_path, capsys, args, message) -> None:
    code, _, err = _history(capsys, *args, "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"))
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# -- the real releases -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("engine, versions, cachings", [
    ("vllm", "0.23.0,0.24.0", {"off", "on"}),
    ("sglang", "0.5.22,0.5.23", {"off"}),
    ("tvm", "0.26.0,0.27.0", {"off"}),  # the length read through debug_get_kv, then through its getter
])
def test_history_runs_two_published_releases_end_to_end(tmp_path, capsys, engine, versions, cachings) -> None:
    """The published wheels (fetched once into the user's cache), on a short trace. Skipped when the package index
    cannot be reached."""
    out = tmp_path / "out"
    code, stdout, err = _history(capsys, engine, versions, "--scenario", "paper", "--reps", "2", "--out", str(out),
                                 "--steps", "40", "--running", "32")
    if code == 2 and "pip download" in err:
        pytest.skip(f"the package index is not reachable: {err.strip()}")
    assert code == 0, err
    rows = read_history(out / "history.csv")
    assert {r.version for r in rows} == set(versions.split(",")) and {r.caching for r in rows} == cachings
    assert all(r.status == "ok" and r.digest.startswith("sha256:") for r in rows)
    assert f"{engine} {versions.replace(',', ' -> ')}" in stdout
    assert isinstance(Path(out / "history.md").read_text(), str)


def _history_row(version: str, value: float):
    from harness.history.records import HistoryRow

    return HistoryRow("vllm", version, "off", "paper", "seq_step_ns", value, value * 0.99, value * 1.01, "ok", 5, 100,
                      "sha256:x", "m", "1.0", "t", "kvblock-bench history vllm 0.1.0..0.3.0", "")


def test_the_readme_section_names_the_releases_a_verdict_moved(tmp_path) -> None:
    import json

    from harness.history.readme_section import markers, write_history_readme
    from harness.history.records import HISTORY_CSV, write_history

    folder = tmp_path / "results" / "history" / "vllm"
    folder.mkdir(parents=True)
    releases = [_history_row("0.1.0", 100.0), _history_row("0.2.0", 101.0), _history_row("0.3.0", 150.0)]
    write_history(folder / HISTORY_CSV, releases)
    (folder / "meta.json").write_text(json.dumps({"command": "kvblock-bench history vllm 0.1.0..0.3.0",
                                                  "machine": "m", "load_average_by_scenario": {"paper": [0.5, 1.5]}}))
    readme = tmp_path / "README.md"
    begin, end = markers("vllm")
    readme.write_text(f"# x\n{begin}\nold\n{end}\ntail\n")
    assert write_history_readme(readme, folder) == "vllm"
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{end}\ntail\n") and "`paper` at load average 0.5 to 1.5" in text
    assert "0.2.0 -> **0.3.0**" in text and "slower" in text and "0.1.0 -> **0.2.0**" not in text
    assert "(results/history/vllm/history.md)" in text
    assert "the engine's change: not identified yet" in text
    # a step's cause, named in changes.csv (read from the two releases' sources), is shown beside it
    (folder / "changes.csv").write_text("version,caching,metric,change\n0.3.0,off,seq_step_ns,a second pass\n")
    write_history_readme(readme, folder)
    assert "slower; the engine's change: a second pass" in readme.read_text()
