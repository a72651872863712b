"""A machine named precisely, and the host's state read around a run (harness/base/host.py, counters/latency.py)."""

from __future__ import annotations

import pytest

from harness.base import host
from harness.counters import latency
from harness.counters.latency import SIZES_KIB, probe
from harness.output.formatting import host_line, machine_line
from harness.run.metadata import TIMING_IDENTITY, collect, host_end, identity_differences

ZEN2 = {"cpu_model": "AMD EPYC", "cpu_count": 2, "caches": {"L2": "512K (8-way)", "L3": "16384K (16-way)"},
        "cpu": {"vendor": "AuthenticAMD", "family": 23, "model": 49, "stepping": 0, "model_name": "AMD EPYC",
                "microarchitecture": "Zen 2", "hypervisor": "KVM", "vcpus": 2}}
ZEN4 = {"cpu_model": "AMD EPYC", "cpu_count": 2, "caches": {"L2": "1024K (8-way)", "L3": "32768K (16-way)"},
        "cpu": {"vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": 1, "model_name": "AMD EPYC",
                "microarchitecture": "Zen 4", "hypervisor": "KVM", "vcpus": 2}}


@pytest.mark.parametrize(("vendor", "family", "model", "name"), [
    ("AuthenticAMD", 23, 49, "Zen 2"), ("AuthenticAMD", 25, 1, "Zen 3"), ("AuthenticAMD", 25, 17, "Zen 4"),
    ("AuthenticAMD", 26, 2, "Zen 5"), ("GenuineIntel", 6, 0x55, "Skylake-SP/Cascade Lake"),
    ("GenuineIntel", 6, 0x8F, "Sapphire Rapids"), ("GenuineIntel", 6, 0x99, ""), ("Other", 1, 1, "")])
def test_microarchitecture_from_cpuid_numbers(vendor: str, family: int, model: int, name: str) -> None:
    assert host.microarchitecture(vendor, family, model) == name


def test_two_epycs_that_print_the_same_name_are_told_apart() -> None:
    assert host.machine_name(ZEN2) != host.machine_name(ZEN4)
    assert "Zen 4: family 25, model 17, stepping 1" in host.machine_name(ZEN4)
    assert "under KVM" in host.machine_name(ZEN4)
    assert host.machine_key(ZEN2) != host.machine_key(ZEN4)
    differences = identity_differences(ZEN2, ZEN4, TIMING_IDENTITY)
    assert any(d.startswith("cpu.family") for d in differences)
    assert any(d.startswith("cpu.model") for d in differences)


def test_same_caches_other_stepping_still_differ() -> None:
    other = {**ZEN4, "cpu": {**ZEN4["cpu"], "stepping": 2}}
    assert identity_differences(ZEN4, other, TIMING_IDENTITY) == ["cpu.stepping 1 -> 2"]


def test_a_run_from_before_the_identity_is_named_by_what_it_has() -> None:
    old = {"cpu_model": "AMD EPYC", "cpu_count": 2, "caches": {"L2": "512K (8-way)"}}
    assert host.machine_name(old) == "AMD EPYC (family, model and stepping not recorded), 2 CPUs; L2 512K"
    assert identity_differences(old, {**old}, TIMING_IDENTITY) == []
    assert identity_differences(old, ZEN2, TIMING_IDENTITY)  # one side cannot tell: not the same machine


def test_this_machine_is_read() -> None:
    meta = collect()
    cpu = meta["cpu"]
    assert cpu["vcpus"] and isinstance(cpu["vendor"], str | type(None))
    assert meta["host"]["start"]["load_average"]
    assert machine_line(meta).startswith(host.machine_name(meta))


def test_steal_between_two_readings() -> None:
    assert host.steal_pct((10, 1000), (30, 2000)) == 2.0
    assert host.steal_pct(None, (30, 2000)) is None
    assert host.steal_pct((10, 1000), (10, 1000)) is None
    ticks = host.cpu_ticks()
    assert ticks is None or (ticks[1] >= ticks[0] >= 0)


def test_the_latency_probe_reads_every_size() -> None:
    found = probe((16, 256))
    assert list(found) == ["16K", "256K"] and all(v > 0 for v in found.values())
    assert len(SIZES_KIB) >= 4


def test_the_latency_probe_reads_each_line_once_on_small_pages(monkeypatch) -> None:
    """A walk goes on where the last stopped: a cycle larger than the caches is read from memory, not re-read."""
    starts, ends, real = [], [], latency._walk.py_func

    def walk(chain, loads, at):
        starts.append(at)
        ends.append(real(chain, loads, at))
        return ends[-1]

    monkeypatch.setattr(latency, "_walk", walk)
    monkeypatch.setattr(latency, "LOADS", 64)
    latency.probe((64,))  # 1,024 lines: the walks after the first take 64 lines each, none twice
    timed = starts[2:]
    assert len(timed) == latency.WALKS and timed == ends[1:-1] and len(set(timed)) == len(timed)
    chain = latency._chain(4096)
    assert not chain.flags.owndata and chain.base is not None  # on the mmap of small_pages, not NumPy's allocator
    assert sorted(chain[:: latency.LINE // 8].tolist()) == list(range(0, len(chain), latency.LINE // 8))


def test_a_probe_without_its_method_is_not_read_past_the_l3() -> None:
    """Before the probe named its method its 64 MiB walk re-read 3.2 MiB: a move there said the page size granted."""
    moved = {"start": {"latency_ns": {"16K": 2.0, "65536K": 154.0}},
             "end": {"latency_ns": {"16K": 2.0, "65536K": 28.0}}}
    assert host.latency_moved(moved) == ""
    moved["start"]["latency_probe"] = latency.METHOD
    assert "memory probe at 65536K" in host.latency_moved(moved)


def meta_with(on_cpu_min: float, steal: float = 0.0, latency_end: float = 2.0) -> dict:
    return {**ZEN4, "host": {"start": {"latency_ns": {"16K": 2.0}, "cpu_ticks": [0, 0]},
                             "end": {"latency_ns": {"16K": latency_end}, "steal_pct": steal},
                             "on_cpu_pct": {"min": on_cpu_min, "median": 99.0, "cells": 3}}}


def test_competing_work_is_said_from_what_was_measured() -> None:
    assert host.competing_work(meta_with(99.5)) == ""
    assert "ran as little as 40" in host.competing_work(meta_with(40.0))
    assert "steal" in host.competing_work(meta_with(99.5, steal=6.0))
    assert "memory probe at 16K" in host.competing_work(meta_with(99.5, latency_end=4.0))
    assert host.competing_work({}) == ""
    assert host_line(meta_with(40.0)).startswith("taken beside competing work")
    assert host_line(meta_with(99.5)).startswith("no competing work seen")
    assert host_line({}) == ""


def test_the_end_reading_summarises_the_cells() -> None:
    meta = {"host": {"start": {"cpu_ticks": list(host.cpu_ticks() or (0, 0)), "latency_ns": {}}}}
    end = host_end(meta, [99.0, 50.0, 100.0])
    assert end["on_cpu_pct"] == {"min": 50.0, "median": 99.0, "cells": 3}
    assert "steal_pct" in end["end"] and "latency_ns" in end["end"]


def test_the_headline_and_reports_say_a_run_was_beside_competing_work(tmp_path) -> None:
    import json
    import shutil

    from harness.output.console import console_summary
    from harness.output.report import paper_table, scenario_summary
    from harness.output.rundata import RunData

    run = tmp_path / "run"
    shutil.copytree("results/sample", run)
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, **meta_with(40.0)}))
    data = RunData.load(run)
    first = console_summary(data).splitlines()[0]
    assert "beside competing work" in first
    assert "Host: Taken beside competing work" in paper_table(data)
    assert "Host: Taken beside competing work" in scenario_summary(data)
    (run / "meta.json").write_text(json.dumps({**meta, **meta_with(99.0)}))
    assert "beside competing work" not in console_summary(RunData.load(run)).splitlines()[0]
