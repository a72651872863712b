"""The engines a contender can be calibrated against, and their baselines.
Design: docs/output.md#harnessenginescatalogpy."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from harness.engines import fetch
from harness.engines.call_meter import WHOLE_STEP
from harness.engines.loader import ImportPlan
from harness.errors import InputError
from scenarios import PAPER, Trace
from scenarios.trace import trace_uses_caching

TVM_CACHING = ("caching off: TVM's paged KV cache has no prefix caching (MLC-LLM's prefix cache, outside the wheel, "
               "shares a prefix through fork_sequence)")
CPP_TIER = ("cpp-flat", "cpp-dict", "cpp-list", "cpp-flat-rows")  # impls/native: calibrated against TVM


@dataclass(frozen=True)
class Baseline:
    """One way of running the engine's code, timed beside our contenders."""

    name: str
    cls: type
    calibrates: tuple[str, ...]
    modelled_by: tuple[str, ...]  # contenders that model exactly this (the report shows their ratio)
    how: str
    plain_traces: bool = True
    caching_traces: bool = False
    real_trace: Callable[[Trace], Trace] | None = None  # the trace as the engine serves it (vLLM: no forks)
    real_trace_how: str = ""
    engine_object: str = ""  # the adapter's attribute holding the engine's object (its calls metered apart)

    def replays(self, trace: Trace) -> bool:
        return self.caching_traces if trace_uses_caching(trace) else self.plain_traces


@dataclass(frozen=True)
class Engine:
    """An engine: its published distribution (None: not on the package index) and its module here."""

    name: str
    label: str
    distribution: str | None
    packages: tuple[str, ...]
    module: str  # harness.engines.<module>: PLAN, load(), baselines(), REGIMES
    regimes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    scenarios: tuple[str, ...] = ("paper", "parallel-sampling")
    history: dict[str, str] = field(default_factory=dict)  # ``history``'s baselines and their caching mode
    engine_objects: dict[str, str] = field(default_factory=dict)  # contender -> its model of the engine's object
    binaries: tuple[str, ...] = ()  # compiled files unpacked too (path prefixes in the wheels; companions(version))
    history_forks: bool = False  # ``history`` replays the fork scenario by default too (the engine forks natively)
    history_how: str = ""  # what every ``history`` row's how adds (what the engine's caching mode means there)

    def code(self) -> ModuleType:
        return importlib.import_module(f"harness.engines.{self.module}")

    def plan(self) -> ImportPlan:
        return self.code().plan()

    def history_scenarios(self) -> list[str]:
        """``history``'s default scenarios: the calibration's, the fork scenario only where the engine forks."""
        return [s for s in self.scenarios if self.history_forks or s != "parallel-sampling"]

    def wheels(self, version: str | None) -> tuple[str | None, tuple[str, ...]]:
        """The version to fetch and the other wheels its compiled code loads (none for a Python-only engine)."""
        return self.code().wheels(version) if self.binaries else (version, ())

    def published(self, version: str | None, cache: Path, find_links: Path | None) -> fetch.EngineCode:
        version, companions = self.wheels(version)
        return fetch.published(self.distribution, version, self.packages, cache, find_links, self.binaries, companions)


ENGINES = {
    "vllm": Engine("vllm", "vLLM", "vllm", ("vllm",), "vllm_engine",
                   {"vllm-v1": ("per-call", "batched"), "vllm-v1-pc": ("per-call", "batched")},
                   (PAPER, "parallel-sampling", "system-prompt-256"), {"caching off": "off", "caching on": "on"},
                   engine_objects={"vllm-v1": "kv_cache_manager", "vllm-v1-pc": "kv_cache_manager"}),
    "sglang": Engine("sglang", "SGLang", "sglang", ("sglang",), "sglang_engine", {"sglang": ("batched",)},
                     history={"one torch thread": "off"}, engine_objects={"sglang": "allocator"}),
    "nano-vllm": Engine("nano-vllm", "nano-vllm", None, ("nanovllm",), "nano_vllm_engine",
                        {"nano-vllm": ("per-call", "batched")}, engine_objects={"nano-vllm": "block_manager"}),
    "lmdeploy": Engine("lmdeploy", "LMDeploy", "lmdeploy", ("lmdeploy",), "lmdeploy_engine",
                       {"lmdeploy": ("per-call", "batched"), "lmdeploy-pc": ("per-call", "batched")},
                       (PAPER, "parallel-sampling", "system-prompt-256"), {"caching off": "off", "caching on": "on"},
                       engine_objects={"lmdeploy": "manager", "lmdeploy-pc": "trie"}),
    "tvm": Engine("tvm", "TVM", "apache-tvm", ("tvm_ffi",), "tvm_engine", {name: ("batched",) for name in CPP_TIER},
                  (PAPER, "parallel-sampling"), {"page bookkeeping": "off"}, dict.fromkeys(CPP_TIER, WHOLE_STEP),
                  ("tvm/lib/libtvm_runtime.so", "tvm_ffi/"), history_forks=True, history_how=TVM_CACHING),
}


def or_list(names) -> str:
    names = list(names)
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


HISTORY_ENGINES = tuple(name for name, e in ENGINES.items() if e.distribution is not None and e.history)
PUBLISHED_ENGINES = tuple(name for name, e in ENGINES.items() if e.distribution is not None)


def parse_engine(text: str) -> tuple[Engine, str | None]:
    """``ENGINE`` or ``ENGINE==VERSION`` -> (engine, version or None)."""
    name, sep, version = text.partition("==")
    name, version = name.strip().lower(), version.strip()
    if name not in ENGINES:
        raise InputError(f"unknown engine {name!r}; known: {', '.join(ENGINES)} (e.g. vllm==0.33.0)")
    if sep and not version:
        raise InputError(f"{text!r}: give a version after '==' (e.g. {name}==0.33.0), or leave '==' out")
    return ENGINES[name], version or None
