"""The named scenarios: what each workload is, its defaults, and how its trace is built.

Request lengths, where a scenario draws them, come from a log-normal distribution whose means default to the
ShareGPT conversation statistics that the vLLM paper reports (Kwon et al., SOSP 2023: 161 prompt tokens and
338 output tokens on average), with a log-space sigma of 1.0 (a long right tail, as in ShareGPT). Every
length is clipped to what a sequence may hold (``max_blocks_per_seq * block_size`` tokens).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from .hashing import UNIQUE, TokenChain
from .realtrace import REAL_TRACES, build_real_trace
from .scheduler import Request, ScenarioError, Scheduler, Seq, TraceBuilder
from .trace import Trace
from .trace.file_format import MAX_POOL_BLOCKS

PAPER = "paper"  # the article's workload: every headline figure and ratio is judged on it

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
# The scale sweeps (issue 29; `make bench-scale`, left out of the default matrix: see harness.run.matrix).
CONCURRENCY_SCALE = (2048, 4096)  # past the default sweep: the pool grows with the sequences (64 blocks each)
CONTEXT_SWEEP = (4096, 16384, 65536, 262144, 1048576)  # the most tokens a sequence may reach
POOL_SWEEP = (16384, 32768, 65536, 131072, 262144, 1048576)  # blocks in the pool (ids widen past 65,536)
CONTEXT_RUNNING = 64  # sequences running in a context-N scenario...
CONTEXT_ROWS = 256  # ...in tables sized, as engines size them, for more (the paper's 256; vLLM: max_num_seqs)
SCALE_STEPS = 500  # decode steps of a context-N or pool-N trace (the concurrency sweep's SWEEP_STEPS)


@dataclass(frozen=True)
class Scenario:
    """A named workload: a one-line description, its defaults, and the function that builds its trace."""

    name: str
    description: str
    defaults: dict
    build: Callable[[str, dict], Trace]
    caching: bool = False  # its trace uses prefix caching (only managers with prefix caching replay it)

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
        example = f"; e.g. --{key.replace('_', '-')} {default}" if default is not None else ""
        raise ScenarioError(f"parameter {key!r} takes a {kind}, got {value!r}{example}") from None


MAX_TOKENS = 2**31 - 1  # token counts are int32 in traces
MAX_ROWS = 1 << 20  # running / concurrency
MAX_SEQUENCE_STEPS = 1 << 25  # steps * running: a synthetic trace of at most a few hundred MB
_BIG = 10**12
# parameter -> (lowest, highest, what it is); a value outside fails naming both and the fix.
LIMITS: dict[str, tuple[float, float, str]] = {
    "num_blocks": (1, MAX_POOL_BLOCKS, "blocks in the pool"),
    "block_size": (1, 1 << 16, "tokens per block, a power of two"),
    "max_blocks_per_seq": (0, MAX_POOL_BLOCKS, "blocks a sequence may hold"),
    "running": (1, MAX_ROWS, "sequences running at once"),
    "concurrency": (1, MAX_ROWS, "sequences running at once"),
    "rows": (1, MAX_ROWS, "table rows (max_seqs): the most sequences the engine is sized for"),
    "steps": (1, MAX_SEQUENCE_STEPS, "decode steps"),
    "max_steps": (1, _BIG, "decode steps a real trace may take"),
    "step_rate": (1, _BIG, "target decode steps per second"),
    "prompt_mean": (1, MAX_TOKENS, "mean prompt tokens"),
    "output_mean": (1, MAX_TOKENS, "mean output tokens"),
    "system_prompt": (1, MAX_TOKENS, "system prompt tokens"),
    "samples": (1, MAX_ROWS, "samples per prompt"),
    "beam_width": (1, MAX_ROWS, "beams per request"),
    "sigma": (0, 10, "log-space standard deviation of the lengths"),
    "prune_prob": (0, 1, "probability that a beam group prunes a beam each step"),
    "hash_tokens": (1, MAX_TOKENS, "prompt tokens per hash id in the CSV's hash_ids column"),
    "turn_mean": (1, MAX_TOKENS, "mean tokens of new user text per chat turn"),
    "turns_mean": (1, 1 << 20, "mean turns per conversation"),
    "think_steps": (0, _BIG, "most decode steps between a chat turn's answer and the next turn"),
    "seed": (0, 2**63 - 1, "random seed"),
    "start_s": (0, _BIG, "seconds into the file where the window starts"),
    "duration_s": (1e-9, _BIG, "seconds of the file to replay"),
}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _fail(key: str, p: dict, need: str, fix: str) -> None:
    raise ScenarioError(f"{_flag(key)} {p[key]!r}: {key} {need}; {fix}")


def _check(name: str, p: dict) -> None:
    """Every parameter in its range and consistent with the others; one-line errors that name the fix."""
    for key, (low, high, what) in LIMITS.items():
        value = p.get(key)
        if value is None or isinstance(value, bool):
            continue
        if not low <= value <= high:  # NaN fails too
            default = SCENARIOS[name].defaults.get(key) if name in SCENARIOS else None
            example = f"e.g. {_flag(key)} {default}" if default is not None else "pick a value in range"
            _fail(key, p, f"must be {'positive, ' if low == 1 else ''}in [{low}, {high}] ({what})", example)
    if p["max_blocks_per_seq"] == 0 and "csv" not in p:
        _fail("max_blocks_per_seq", p, "must be positive (0 means 'fit the longest request' only for CSV traces)",
              "e.g. --max-blocks-per-seq 256")
    if p["block_size"] & (p["block_size"] - 1):
        _fail("block_size", p, "must be a power of two (as in vLLM, SGLang and TensorRT-LLM)", "e.g. --block-size 16")
    _check_sizes(p)


def _check_sizes(p: dict) -> None:
    if p["max_blocks_per_seq"] > p["num_blocks"]:
        _fail("max_blocks_per_seq", p, f"exceeds the pool ({p['num_blocks']} blocks)",
              "lower --max-blocks-per-seq or raise --num-blocks")
    cap = (p["max_blocks_per_seq"] or p["num_blocks"]) * p["block_size"]
    if cap > MAX_TOKENS:
        _fail("block_size", p, f"times blocks per sequence gives {cap} tokens, more than {MAX_TOKENS}",
              "lower --max-blocks-per-seq or --block-size")
    for key in ("prompt_mean", "system_prompt"):
        if key in p and p[key] >= cap:
            _fail(key, p, f"does not fit a sequence of {cap} tokens", "lower it or raise --max-blocks-per-seq")
    rows = "running" if "running" in p else "concurrency"
    if p[rows] > p["num_blocks"]:
        _fail(rows, p, f"exceeds the pool's {p['num_blocks']} blocks (each sequence needs at least one; "
              "nothing is capped silently)", f"lower {_flag(rows)} or raise --num-blocks")
    if p.get("rows", p[rows]) < p[rows]:
        _fail("rows", p, f"is below {rows}={p[rows]} (each running sequence takes a row)", f"raise --rows or lower "
              f"{_flag(rows)}")
    for key in ("samples", "beam_width"):
        if key in p and p[key] > p[rows]:
            _fail(key, p, f"exceeds running={p[rows]} (a group takes {key} rows)", "raise --running or lower it")
    if "steps" in p and p["steps"] * p[rows] > MAX_SEQUENCE_STEPS:
        _fail("steps", p, f"times running={p[rows]} exceeds {MAX_SEQUENCE_STEPS} sequence-steps (a trace too large "
              "to hold)", "lower --steps or --running")


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
    sched = Scheduler(TraceBuilder(_config(p, p.get("rows", p["running"]))), source, p["running"], preempt=True)
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


# -- prefix caching: multi-turn chat, shared system prompt --------------------------------------------------
class ChatSource:
    """Closed loop of conversations. A conversation's next turn arrives up to ``think_steps`` steps after its
    previous turn finished; its prompt is the previous prompt and answer plus ``turn_mean`` tokens (log-normal) of
    new text, and its hash chain repeats the previous stream's full blocks (the sealed answer blocks included).
    The number of turns is geometric with mean ``turns_mean``; a conversation also ends when its next turn would
    not fit a sequence. Ready follow-up turns are admitted before new conversations."""

    def __init__(self, p: dict, rng: np.random.Generator) -> None:
        self.p, self.rng, self.sample = p, rng, LengthSampler(p, rng)
        self.ids = itertools.count()
        self.turns_left: dict[int, int] = {}
        self.followups: list[tuple[int, int, Request]] = []  # heap of (ready step, rid, request)

    def __call__(self, step: int, want: int) -> Iterator[Request]:
        for _ in range(want):
            if self.followups and self.followups[0][0] <= step:
                yield heapq.heappop(self.followups)[2]
                continue
            rid = next(self.ids)
            prompt, output = self.sample()
            self.turns_left[rid] = int(self.rng.geometric(1 / self.p["turns_mean"])) - 1
            yield Request(rid, prompt, output, step, chain=TokenChain(UNIQUE | rid))

    def finished(self, req: Request, step: int) -> None:
        """Schedule the conversation's next turn, if it has one and it fits."""
        left = self.turns_left.pop(req.rid)
        history = req.prompt + req.output
        prompt = history + int(lognormal_lengths(self.rng, self.p["turn_mean"], self.p["sigma"], 1)[0])
        output = self.sample()[1]
        if left <= 0 or prompt + output > self.sample.cap:
            return
        rid = next(self.ids)
        self.turns_left[rid] = left - 1
        chain = req.chain.branch(history // self.p["block_size"], UNIQUE | rid)
        ready = step + int(self.rng.integers(0, self.p["think_steps"] + 1))
        heapq.heappush(self.followups, (ready, rid, Request(rid, prompt, output, ready, chain=chain)))


class ChatScheduler(Scheduler):
    """Hands each finished turn back to its conversation (:class:`ChatSource`)."""

    def finished(self, seq: Seq) -> None:
        self.source.finished(seq.req, self.step)


def build_chat(name: str, p: dict) -> Trace:
    source = ChatSource(p, np.random.default_rng(p["seed"]))
    sched = ChatScheduler(TraceBuilder(_config(p, p["running"])), source, p["running"], preempt=True)
    return _run(sched, name, p)


SYSTEM_CONTENT = 1  # content id of the shared system prompt's blocks


def system_prompt_source(p: dict, sample: LengthSampler, warm: int) -> Callable[[int, int], Iterator[Request]]:
    """Requests whose prompt is the shared ``system_prompt`` followed by the user's own text (log-normal, mean
    ``prompt_mean``); the first ``warm`` start part-way through their output, as in :func:`closed_loop`."""
    ids, system = itertools.count(), TokenChain(SYSTEM_CONTENT)
    shared = p["system_prompt"] // p["block_size"]  # a partial last system block holds user text: not shared

    def source(step: int, want: int) -> Iterator[Request]:
        for _ in range(want):
            rid = next(ids)
            user, output = sample()
            prompt = p["system_prompt"] + min(user, sample.cap - p["system_prompt"] - 1)
            output = min(output, sample.cap - prompt)
            done = int(sample.rng.integers(0, output)) if rid < warm else 0
            yield Request(rid, prompt, output, step, done, chain=system.branch(shared, UNIQUE | rid))

    return source


def build_system_prompt(name: str, p: dict) -> Trace:
    sample = LengthSampler(p, np.random.default_rng(p["seed"]))
    source = system_prompt_source(p, sample, p["running"] if p["warm_start"] else 0)
    sched = Scheduler(TraceBuilder(_config(p, p["running"])), source, p["running"], preempt=True)
    return _run(sched, name, p)


def _caching_scenarios() -> dict[str, Scenario]:
    chat = {**COMMON, "steps": 1000, "output_mean": 128, "turn_mean": 48, "turns_mean": 6, "think_steps": 50}
    out = {
        "chat-multiturn": Scenario(
            "chat-multiturn", "Prefix caching, multi-turn chat: each turn's prompt is the previous prompt and answer "
            "plus new text (mean 6 turns), so sealed answer blocks are hit by the next turn; 256 sequences",
            chat, build_chat, caching=True),
        "tight-pool-cached": Scenario(
            "tight-pool-cached", "Prefix caching, chat-multiturn in a 13,312-block pool (its 256 chats hold up to "
            "13,051): once the never-cached blocks run out (step 428) the cache evicts in every step, "
            "31 evictions per step over the trace",
            {**chat, "num_blocks": 13312}, build_chat, caching=True),
    }
    for n, steps in ((256, 1000), (1024, 250)):
        out[f"system-prompt-{n}"] = Scenario(
            f"system-prompt-{n}", f"Prefix caching, a shared 1,024-token system prompt and each user's own text, "
            f"{n} sequences: every admission hits the system prompt's 64 cached blocks",
            {**COMMON, "running": n, "steps": steps, "system_prompt": 1024, "warm_start": True},
            build_system_prompt, caching=True)
    return out


def _scale_scenarios() -> dict[str, Scenario]:
    """The context and pool sweeps: one parameter swept, the rest held (docs/scale.md)."""
    out = {}
    for tokens in CONTEXT_SWEEP:
        blocks = tokens // COMMON["block_size"]
        out[f"context-{tokens}"] = Scenario(
            f"context-{tokens}", f"Sequences may reach {tokens:,} tokens ({blocks:,} blocks): {CONTEXT_RUNNING} "
            f"running of {CONTEXT_ROWS} table rows, prompts of {tokens // 8:,} tokens on average (log-normal, sigma "
            f"1.5: most far shorter, a few clipped at the limit), a pool of {16 * blocks:,} blocks (16 full "
            "sequences) (context sweep)",
            {**COMMON, "running": CONTEXT_RUNNING, "rows": CONTEXT_ROWS, "max_blocks_per_seq": blocks,
             "num_blocks": 16 * blocks, "prompt_mean": tokens // 8, "sigma": 1.5, "steps": SCALE_STEPS,
             "warm_start": True}, build_independent)
    for blocks in POOL_SWEEP:
        ids = "uint16" if blocks <= 65536 else "uint32"
        out[f"pool-{blocks}"] = Scenario(
            f"pool-{blocks}", f"The paper workload in a pool of {blocks:,} blocks ({ids} ids in flat) (pool sweep)",
            {**COMMON, "num_blocks": blocks, "steps": SCALE_STEPS, "warm_start": True}, build_independent)
    return out


def _scenarios() -> dict[str, Scenario]:
    out = {
        PAPER: Scenario(
            PAPER, "The article's workload: 65,536 blocks, 256 sequences always running, 2,000 steps",
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
    for n in CONCURRENCY_SCALE:
        out[f"concurrency-{n}"] = Scenario(
            f"concurrency-{n}", f"The paper workload at {n:,} concurrent sequences in a pool of {64 * n:,} blocks "
            "(64 per sequence: 65,536 cannot hold them; uint32 ids in flat) (concurrency sweep, scale part)",
            {**COMMON, "running": n, "num_blocks": 64 * n, "warm_start": True}, build_independent)
    out |= _scale_scenarios()
    for name, real in REAL_TRACES.items():
        out[name] = Scenario(name, real.description, dict(real.defaults), build_real_trace,
                             caching=real.defaults.get("prefix_caching", False))
    return out | _caching_scenarios()


SCENARIOS: dict[str, Scenario] = _scenarios()


def generate(name: str, **overrides: object) -> Trace:
    """Build the trace of scenario ``name`` with parameter overrides."""
    if name not in SCENARIOS:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name].generate(**overrides)
