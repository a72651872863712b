"""The machine a run measured on, named precisely, and the host's state around it. Design:
docs/measurement.md#host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

# CPUID (vendor, family, first model, last model) -> microarchitecture, from the vendors' published numbers.
MICROARCHITECTURES = (
    ("AuthenticAMD", 23, 0x00, 0x2F, "Zen/Zen+"),
    ("AuthenticAMD", 23, 0x30, 0xAF, "Zen 2"),
    ("AuthenticAMD", 25, 0x00, 0x0F, "Zen 3"),
    ("AuthenticAMD", 25, 0x10, 0x1F, "Zen 4"),
    ("AuthenticAMD", 25, 0x20, 0x5F, "Zen 3"),
    ("AuthenticAMD", 25, 0x60, 0x7F, "Zen 4"),
    ("AuthenticAMD", 25, 0xA0, 0xAF, "Zen 4c"),
    ("AuthenticAMD", 26, 0x00, 0xFF, "Zen 5"),
    ("GenuineIntel", 6, 0x3F, 0x3F, "Haswell-EP"),
    ("GenuineIntel", 6, 0x4F, 0x4F, "Broadwell-EP"),
    ("GenuineIntel", 6, 0x55, 0x55, "Skylake-SP/Cascade Lake"),
    ("GenuineIntel", 6, 0x6A, 0x6C, "Ice Lake-SP"),
    ("GenuineIntel", 6, 0x8F, 0x8F, "Sapphire Rapids"),
    ("GenuineIntel", 6, 0xCF, 0xCF, "Emerald Rapids"),
    ("GenuineIntel", 6, 0xAD, 0xAE, "Granite Rapids"),
    ("GenuineIntel", 6, 0xAF, 0xAF, "Sierra Forest"),
)
IDENTITY_KEYS = ("vendor", "family", "model", "stepping")


def cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def lscpu() -> dict[str, str]:
    """``lscpu``'s fields by name (what the hypervisor shows among them); empty where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu", "-J"], capture_output=True, text=True, timeout=10, check=False).stdout
        entries = json.loads(out).get("lscpu", [])
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError):
        return {}
    return {str(e.get("field", "")).rstrip(":"): str(e.get("data", "")) for e in entries if isinstance(e, dict)}


def _int(text: str | None) -> int | None:
    try:
        return int(str(text), 0) if text is not None else None
    except ValueError:
        return None


def microarchitecture(vendor: str, family: int | None, model: int | None) -> str:
    """The microarchitecture of a CPUID vendor, family and model, or "" where the table does not know it."""
    for v, f, first, last, name in MICROARCHITECTURES:
        if vendor == v and family == f and model is not None and first <= model <= last:
            return name
    return ""


def cpu_identity() -> dict:
    """This machine's CPUID identity, microarchitecture, hypervisor and vCPUs (None where unreadable)."""
    info, ls = cpuinfo(), lscpu()
    vendor = info.get("vendor_id", "")
    family, model = _int(info.get("cpu family")), _int(info.get("model"))
    flags = info.get("flags", "").split()
    hypervisor = ls.get("Hypervisor vendor") or ("present, vendor not shown" if "hypervisor" in flags else "none")
    return {"vendor": vendor or None, "family": family, "model": model, "stepping": _int(info.get("stepping")),
            "microcode": info.get("microcode"), "model_name": info.get("model name"),
            "microarchitecture": microarchitecture(vendor, family, model) or None, "hypervisor": hypervisor,
            "virtualization": ls.get("Virtualization type") or None, "vcpus": os.cpu_count()}


def machine_name(meta: dict) -> str:
    """One line naming a run's machine (a run made before ``cpu`` was recorded: by what it has)."""
    cpu = meta.get("cpu") if isinstance(meta.get("cpu"), dict) else {}
    caches = meta.get("caches") if isinstance(meta.get("caches"), dict) else {}
    name = str(cpu.get("model_name") or meta.get("cpu_model") or "?")
    numbers = ", ".join(f"{k} {cpu[k]}" for k in ("family", "model", "stepping") if cpu.get(k) is not None)
    arch = cpu.get("microarchitecture")
    detail = f"{arch}: {numbers}" if arch and numbers else (numbers or "family, model and stepping not recorded")
    count = cpu.get("vcpus") or meta.get("cpu_count") or "?"
    hyper = cpu.get("hypervisor")
    where = f" under {hyper}" if hyper and hyper != "none" else ""
    sizes = ", ".join(f"{k} {str(v).split(' ')[0]}" for k, v in caches.items())
    return f"{name} ({detail}), {count} CPUs{where}" + (f"; {sizes}" if sizes else "")


def machine_key(meta: dict) -> str:
    """A short key that differs between two machine kinds."""
    cpu = meta.get("cpu") if isinstance(meta.get("cpu"), dict) else {}
    caches = meta.get("caches") if isinstance(meta.get("caches"), dict) else {}
    parts = [str(cpu.get(k, "?")) for k in IDENTITY_KEYS] if cpu else [str(meta.get("cpu_model", "?"))]
    parts += [f"{cpu.get('vcpus') or meta.get('cpu_count', '?')}cpu",
              *(str(caches.get(k, "?")).split(" ")[0] for k in ("L2", "L3"))]
    return "-".join(p.replace(" ", "") for p in parts)


def cpu_ticks() -> tuple[int, int] | None:
    """The machine's (steal, total) clock ticks since boot (``/proc/stat``); None where unread."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    values = [int(x) for x in fields[1:]]
    return values[7], sum(values[:8])  # user nice system idle iowait irq softirq steal (guest counted in user)


def steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two :func:`cpu_ticks` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round(100.0 * (after[0] - before[0]) / (after[1] - before[1]), 2)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# Beyond these a run was beside competing work (docs/measurement.md#host).
ON_CPU_MIN_PCT = 95.0
STEAL_MAX_PCT = 2.0
LATENCY_MOVED = 1.25
# A probe that names no method (``latency_probe``; runs before 2026-12-06) re-read 3.2 MiB on pages of the size the
# kernel granted: its reading past the L3 said the page size, not the host (docs/measurement.md#host).
UNREAD_WITHOUT_METHOD = ("65536K",)


def competing_work(meta: dict) -> str:
    """Why a run was measured beside competing work ("" when nothing it recorded says so)."""
    host = meta.get("host") if isinstance(meta.get("host"), dict) else {}
    reasons = []
    on_cpu = host.get("on_cpu_pct") if isinstance(host.get("on_cpu_pct"), dict) else {}
    if isinstance(on_cpu.get("min"), int | float) and on_cpu["min"] < ON_CPU_MIN_PCT:
        reasons.append(f"its threads ran as little as {on_cpu['min']:g} % of a timed slice's wall time")
    end = host.get("end") if isinstance(host.get("end"), dict) else {}
    steal = end.get("steal_pct")
    if isinstance(steal, int | float) and steal > STEAL_MAX_PCT:
        reasons.append(f"the hypervisor took {steal:g} % of the CPU time (steal)")
    moved = latency_moved(host)
    if moved:
        reasons.append(moved)
    return "; ".join(reasons)


def latency_moved(host: dict) -> str:
    """The memory probe's largest move, start to end, in words (beyond :data:`LATENCY_MOVED` only)."""
    start = (host.get("start") or {}).get("latency_ns") if isinstance(host.get("start"), dict) else None
    end = (host.get("end") or {}).get("latency_ns") if isinstance(host.get("end"), dict) else None
    if not isinstance(start, dict) or not isinstance(end, dict):
        return ""
    unread = () if host["start"].get("latency_probe") else UNREAD_WITHOUT_METHOD
    moves = [(max(end[k] / start[k], start[k] / end[k]), k) for k in start
             if isinstance(start.get(k), int | float) and isinstance(end.get(k), int | float) and start[k] > 0
             and end[k] > 0 and k not in unread]
    factor, size = max(moves, default=(1.0, ""))
    if factor <= LATENCY_MOVED:
        return ""
    return f"the memory probe at {size} read {start[size]:g} ns at the start and {end[size]:g} ns at the end"
