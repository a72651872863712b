"""The named scenarios: what each workload is, its defaults, and how its trace is built.

Request lengths, where a scenario draws them, come from a log-normal distribution whose means default to the
ShareGPT conversation statistics that the vLLM paper reports (Kwon et al., SOSP 2023: 161 prompt tokens and
338 output tokens on average), with a log-space sigma of 1.0 (a long right tail, as in ShareGPT). Every
length is clipped to what a sequence may hold (``max_blocks_per_seq * block_size`` tokens).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from .realtrace import REAL_TRACES, build_real_trace
from .scheduler import Request, ScenarioError, Scheduler, Seq, TraceBuilder
from .trace import Trace

COMMON = {
    "num_blocks": 65536,
    "block_size": 16,
    "max_blocks_per_seq": 256,
    "running": 256,
    "steps": 2000,
    "step_rate": 2000,
    "prompt_mean": 161,
    "output_mean": 338,
    "sigma": 1.0,
    "seed": 0,
}
CONCURRENCY_SWEEP = (64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Scenario:
    """A named workload: a one-line description, its defaults, and the function that builds its trace."""

    name: str
    description: str
    defaults: dict
    build: Callable[[str, dict], Trace]

    def params(self, overrides: dict | None = None) -> dict:
        """Defaults merged with ``overrides`` (strings from the command line are converted)."""
        params = dict(self.defaults)
        for key, value in (overrides or {}).items():
            key = key.replace("-", "_")
            if key not in params:
                raise ScenarioError(f"scenario {self.name!r} has no parameter {key!r}; it has {sorted(params)}")
            params[key] = _convert(key, value, params[key])
        _check(self.name, params)
        return params

    def generate(self, **overrides: object) -> Trace:
        """Build this scenario's trace (deterministic for given parameters and seed)."""
        return self.build(self.name, self.params(overrides))


def _convert(key: str, value: object, default: object) -> object:
    """Coerce an override to the type of its default; strings come from the command line."""
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return str(value).lower() in ("1", "true", "yes", "on")
            raise ValueError(value)
        if isinstance(default, int):
            if isinstance(value, bool):
                raise ValueError(value)
            number = float(value)
            if number != int(number):
                raise ValueError(value)
            return int(number)
        if isinstance(default, float) or default is None:
            return None if value is None or str(value).lower() == "none" else float(value)
        return type(default)(value)
    except (TypeError, ValueError, OverflowError):
        kind = "number" if default is None else type(default).__name__
        raise ScenarioError(f"parameter {key!r} takes a {kind}, got {value!r}") from None


def _check(name: str, p: dict) -> None:
    positive = ("num_blocks", "block_size", "running", "steps", "step_rate",
                "prompt_mean", "output_mean", "samples", "beam_width", "system_prompt", "concurrency")
    for key in positive:
        if key in p and p[key] is not None and p[key] <= 0:
            raise ScenarioError(f"{name}: {key} must be positive, got {p[key]}")
    if "sigma" in p and p["sigma"] < 0:
        raise ScenarioError(f"{name}: sigma must be >= 0")
    if "prune_prob" in p and not 0 <= p["prune_prob"] <= 1:
        raise ScenarioError(f"{name}: prune_prob must lie in [0, 1]")
    if p["max_blocks_per_seq"] < 0 or (p["max_blocks_per_seq"] == 0 and "csv" not in p):
        raise ScenarioError(f"{name}: max_blocks_per_seq must be positive, got {p['max_blocks_per_seq']}")
    cap = (p["max_blocks_per_seq"] or p["num_blocks"]) * p["block_size"]
    if p["max_blocks_per_seq"] > p["num_blocks"]:
        raise ScenarioError(
            f"{name}: max_blocks_per_seq={p['max_blocks_per_seq']} exceeds the pool ({p['num_blocks']} blocks)"
        )
    if "prompt_mean" in p and p["prompt_mean"] >= cap:
        raise ScenarioError(f"{name}: prompt_mean={p['prompt_mean']} does not fit a sequence of {cap} tokens")
    if "system_prompt" in p and p["system_prompt"] >= cap:
        raise ScenarioError(f"{name}: system_prompt={p['system_prompt']} does not fit a sequence of {cap} tokens")


def _config(p: dict, max_seqs: int) -> dict:
    return {"num_blocks": p["num_blocks"], "block_size": p["block_size"], "max_seqs": max_seqs,
            "max_blocks_per_seq": p["max_blocks_per_seq"]}


def lognormal_lengths(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """Integer lengths >= 1 from a log-normal with the given arithmetic mean and log-space sigma."""
    mu = math.log(mean) - sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, size))).astype(np.int64)


class LengthSampler:
    """Draws (prompt, output) pairs that fit a sequence; batches draws for speed, deterministic per seed."""

    def __init__(self, p: dict, rng: np.random.Generator, prompt: int | None = None) -> None:
        self.p, self.rng, self.fixed_prompt = p, rng, prompt
        self.cap = p["max_blocks_per_seq"] * p["block_size"]
        self._buf: Iterator[tuple[int, int]] = iter(())

    def _refill(self) -> None:
        n = 4096
        prompts = lognormal_lengths(self.rng, self.p["prompt_mean"], self.p["sigma"], n)
        outputs = lognormal_lengths(self.rng, self.p["output_mean"], self.p["sigma"], n)
        if self.fixed_prompt is not None:
            prompts[:] = self.fixed_prompt
        prompts = np.minimum(prompts, self.cap - 1)
        outputs = np.minimum(outputs, self.cap - prompts)
        self._buf = iter(zip(prompts.tolist(), outputs.tolist(), strict=True))

    def __call__(self) -> tuple[int, int]:
        try:
            return next(self._buf)
        except StopIteration:
            self._refill()
            return next(self._buf)

    def output(self, prompt: int) -> int:
        """Another output length for the same prompt (a parallel sample)."""
        return min(self()[1], self.cap - prompt)


def closed_loop(sample: LengthSampler, warm: int = 0) -> Callable[[int, int], Iterator[Request]]:
    """An endless supply of requests. The first ``warm`` start part-way through their output (uniformly),
    so that step 0 already looks like steady-state continuous batching rather than 256 fresh prompts."""
    ids = itertools.count()

    def source(step: int, want: int) -> Iterator[Request]:
        for _ in range(want):
            rid = next(ids)
            prompt, output = sample()
            done = int(sample.rng.integers(0, output)) if rid < warm else 0
            yield Request(rid, prompt, output, step, done)

    return source


def _run(sched: Scheduler, name: str, p: dict) -> Trace:
    for _ in range(p["steps"]):
        sched.run_step()
    return sched.finish(name, p, p["seed"])


# -- independent requests: paper, concurrency sweep, pressure, long context --------------------------------
def build_independent(name: str, p: dict) -> Trace:
    rng = np.random.default_rng(p["seed"])
    sample = LengthSampler(p, rng)
    source = closed_loop(sample, warm=p["running"] if p.get("warm_start", True) else 0)
    sched = Scheduler(TraceBuilder(_config(p, p["running"])), source, p["running"], preempt=True)
    return _run(sched, name, p)


# -- shared system prompt: every sequence forks a resident root -------------------------------------------
class SharedPrefixScheduler(Scheduler):
    """Row 0 holds the system prompt for the whole run; each request forks it, so its blocks' ref counts
    reach the hundreds, and the first token each request writes into the shared partial block copies it."""

    def __init__(self, builder: TraceBuilder, source, p: dict) -> None:
        super().__init__(builder, source, p["running"], preempt=False)
        self.root = self.free_rows.pop()
        builder.can_allocate(math.ceil(p["system_prompt"] / p["block_size"]))
        builder.allocate(self.root, p["system_prompt"])

    def place(self, req: Request) -> list[Seq] | None:
        if not self.b.can_allocate(self.reserve + 1):
            return None
        row = self.free_rows.pop()
        self.b.fork(self.root, row)
        return [Seq(row, req, self.admissions)]


def build_shared_prefix(name: str, p: dict) -> Trace:
    rng = np.random.default_rng(p["seed"])
    sample = LengthSampler(p, rng, prompt=p["system_prompt"])
    sched = SharedPrefixScheduler(TraceBuilder(_config(p, p["running"] + 1)), closed_loop(sample), p)
    return _run(sched, name, p)


# -- groups: parallel sampling and beam search ----------------------------------------------------------
class GroupScheduler(Scheduler):
    """A request occupies ``width`` rows: one allocation and ``width - 1`` forks of it."""

    def __init__(self, builder: TraceBuilder, source, p: dict, width: int, sample: LengthSampler,
                 same_output: bool) -> None:
        super().__init__(builder, source, p["running"], preempt=False)
        self.width, self.sample, self.same_output = width, sample, same_output

    def rows_needed(self, req: Request) -> int:
        return self.width

    def place(self, req: Request) -> list[Seq] | None:
        bs = self.b.model.block_size
        if not self.b.can_allocate(-(-req.prompt // bs) + self.reserve + self.width):
            return None
        parent = self.free_rows.pop()
        self.b.allocate(parent, req.prompt)
        seqs = [Seq(parent, req, self.admissions, group=req.rid)]
        for _ in range(self.width - 1):
            child = self.free_rows.pop()
            self.b.fork(parent, child)
            output = req.output if self.same_output else self.sample.output(req.prompt)
            seqs.append(Seq(child, replace(req, output=output), self.admissions, group=req.rid))
        return seqs


class BeamSearchScheduler(GroupScheduler):
    """Each step, each beam group prunes a beam with probability ``prune_prob`` and forks a surviving beam
    into its row (the fork shares the survivor's partial last block, so the next append copies it)."""

    def __init__(self, builder: TraceBuilder, source, p: dict, sample: LengthSampler) -> None:
        super().__init__(builder, source, p, p["beam_width"], sample, same_output=True)
        self.prune_prob = p["prune_prob"]
        self.rng = sample.rng

    def events(self) -> None:
        groups: dict[int, list[Seq]] = {}
        for seq in self.running:
            groups.setdefault(seq.group, []).append(seq)
        for beams in groups.values():
            if len(beams) < 2 or self.rng.random() >= self.prune_prob:
                continue
            victim, survivor = (beams[i] for i in self.rng.choice(len(beams), 2, replace=False))
            if not self.b.can_allocate(self.reserve + 1):  # the fork may add one copy-on-write
                continue
            self.b.free(victim.row)
            self.b.fork(survivor.row, victim.row)
            victim.req = replace(survivor.req)
            self.reserve += 1


def build_parallel_sampling(name: str, p: dict) -> Trace:
    rng = np.random.default_rng(p["seed"])
    sample = LengthSampler(p, rng)
    sched = GroupScheduler(TraceBuilder(_config(p, p["running"])), closed_loop(sample), p, p["samples"], sample,
                           same_output=False)
    return _run(sched, name, p)


def build_beam_search(name: str, p: dict) -> Trace:
    rng = np.random.default_rng(p["seed"])
    sample = LengthSampler(p, rng)
    sched = BeamSearchScheduler(TraceBuilder(_config(p, p["running"])), closed_loop(sample), p, sample)
    return _run(sched, name, p)


def _scenarios() -> dict[str, Scenario]:
    out = {
        "paper": Scenario(
            "paper", "The article's workload: 65,536 blocks, 256 sequences always running, 2,000 steps",
            {**COMMON, "warm_start": True}, build_independent),
        "shared-prefix": Scenario(
            "shared-prefix", "One resident 1,000-token system prompt forked by every sequence (refs in the hundreds)",
            {**COMMON, "system_prompt": 1000}, build_shared_prefix),
        "parallel-sampling": Scenario(
            "parallel-sampling", "n=4 samples per prompt via fork, diverging through copy-on-write",
            {**COMMON, "samples": 4}, build_parallel_sampling),
        "beam-search": Scenario(
            "beam-search", "Beam width 4: each step groups prune a beam and fork a survivor (p=0.3)",
            {**COMMON, "beam_width": 4, "prune_prob": 0.3}, build_beam_search),
        "pressure": Scenario(
            "pressure", "A 6,144-block pool too small for 256 sequences: recompute preemption of the youngest",
            {**COMMON, "num_blocks": 6144, "prompt_mean": 512, "output_mean": 512, "warm_start": True},
            build_independent),
        "long-context": Scenario(
            "long-context", "8 sequences growing to tens of thousands of tokens (4,096 blocks per sequence)",
            {**COMMON, "running": 8, "max_blocks_per_seq": 4096, "prompt_mean": 16000, "output_mean": 4000,
             "sigma": 0.5, "warm_start": True}, build_independent),
    }
    for n in CONCURRENCY_SWEEP:
        out[f"concurrency-{n}"] = Scenario(
            f"concurrency-{n}", f"The paper workload at {n} concurrent sequences (concurrency sweep)",
            {**COMMON, "running": n, "warm_start": True}, build_independent)
    for name, real in REAL_TRACES.items():
        out[name] = Scenario(name, real.description, dict(real.defaults), build_real_trace)
    return out


SCENARIOS: dict[str, Scenario] = _scenarios()


def generate(name: str, **overrides: object) -> Trace:
    """Build the trace of scenario ``name`` with parameter overrides."""
    if name not in SCENARIOS:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name].generate(**overrides)
