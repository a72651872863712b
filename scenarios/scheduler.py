"""A vLLM-style continuous-batching scheduler, simulated once against the reference model.

Every decision (admit, preempt, fork, free) is taken on the reference model's counts, and every contract
call is recorded into a trace. All conforming implementations agree on those counts, so the recorded
decisions are valid for every one of them.

Each step, in this order (the order the trace keeps):

0. with prefix caching, seal every block the previous step's decode filled (its hash from the request's
   :class:`~scenarios.hashing.TokenChain`), so a finished sequence's last full block is cached before it is freed;
1. free the sequences that finished in the previous step;
2. reserve the decode step's worst case with ``can_allocate`` (one block per sequence at a block boundary
   or with a shared last block); while it fails, preempt the youngest sequence (free it and put it back at
   the head of the queue with what it generated so far: recompute, as vLLM does) - or, in scenarios that do
   not preempt, stop with an error saying the pool is too small;
3. admit waiting requests while a row is free and ``can_allocate`` grants their blocks plus the reserve (a
   request with a hash chain is admitted with ``allocate_cached``; it asks for the blocks the reference model's
   ``cached_need`` counts: fresh blocks plus evictable hits);
4. scenario events (beam search prunes and forks here);
5. one decode step over every running sequence, in row order.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from impls.contract import blocks_for
from impls.core.reference import ReferenceModel

from .hashing import TokenChain
from .trace import ALLOCATE, ALLOCATE_CACHED, APPEND, CAN_ALLOCATE, FORK, FREE, OP_NAMES, SEAL, Trace, canonical_tables
from .trace.storage import finalize

# Bump when a change to the scheduler or the scenarios changes the traces they generate for the same parameters.
GENERATOR_VERSION = 1


class ScenarioError(ValueError):
    """Parameters that cannot make a valid trace (say, prompts larger than the pool)."""


@dataclass
class Request:
    """One request: prompt and output lengths in tokens, arrival step, tokens generated so far."""

    rid: int
    prompt: int
    output: int
    arrival: int = 0
    generated: int = 0
    chain: TokenChain | None = None  # with prefix caching: the block hashes of its prompt and output




@dataclass
class Seq:
    """A running sequence: its row, its request, and when it was admitted (for 'youngest')."""

    row: int
    req: Request
    admitted: int
    group: int = -1


class TraceBuilder:
    """Records contract calls against the reference model, step by step."""

    def __init__(self, config: dict) -> None:
        self.config = dict(config)
        self.model = ReferenceModel(**self.config)
        self.op, self.a0, self.a1, self.op_hash = array("B"), array("i"), array("i"), array("q")
        self.step_offsets, self.decode_offsets, self.step_cows = array("q", [0]), array("q"), array("i")
        self.hashes = array("Q")
        self.step_hits, self.step_evictions = array("i"), array("i")
        self.hits = 0  # prompt tokens served from the cache in the current step
        self.evictions_before = 0  # the model's eviction count when the current step began
        self.peak = 0
        self.preemptions = 0

    def _record(self, op: int, a0: int, a1: int = 0, hashes: Sequence[int] = ()) -> None:
        self.op.append(op)
        self.a0.append(a0)
        self.a1.append(a1)
        self.op_hash.append(len(self.hashes) if op in (ALLOCATE_CACHED, SEAL) else -1)
        self.hashes.extend(hashes)

    def _update_peak(self) -> None:
        self.peak = max(self.peak, self.model.num_blocks - self.model.num_free_blocks())

    def can_allocate(self, n: int) -> bool:
        ok = self.model.can_allocate(n)
        self._record(CAN_ALLOCATE, n, int(ok))
        return ok

    def allocate(self, row: int, tokens: int) -> None:
        self.model.allocate(row, tokens)
        self._record(ALLOCATE, row, tokens)
        self._update_peak()

    def cached_need(self, tokens: int, chain: Sequence[int]) -> int:
        """Free blocks admitting a prompt with this hash chain takes (fresh blocks plus evictable hits)."""
        return self.model.cached_need(tokens, list(chain))

    def allocate_cached(self, row: int, tokens: int, chain: Sequence[int]) -> int:
        """Admit a prompt with its hash chain (its full blocks); returns the tokens the cache served."""
        hit = self.model.allocate_cached(row, tokens, np.array(chain, dtype=np.uint64))
        self._record(ALLOCATE_CACHED, row, tokens, chain)
        self.hits += hit
        self._update_peak()
        return hit

    def seal(self, row: int, block_hash: int) -> bool:
        """Give ``row``'s full last block its hash; whether it became cached."""
        ok = self.model.seal(row, block_hash)
        self._record(SEAL, row, int(ok), (block_hash,))
        return ok

    def fork(self, parent: int, child: int) -> None:
        self.model.fork(parent, child)
        self._record(FORK, parent, child)

    def free(self, row: int) -> None:
        self.model.free(row)
        self._record(FREE, row)

    def decode(self, rows: list[int]) -> None:
        """The step's decode appends; closes the step."""
        self.decode_offsets.append(len(self.op))
        for row in rows:
            self._record(APPEND, row)
        cows, _ = self.model.decode_step(rows)
        self.step_cows.append(len(cows))
        self._update_peak()
        self.step_offsets.append(len(self.op))
        self.step_hits.append(self.hits)
        self.step_evictions.append(self.model.evictions - self.evictions_before)
        self.hits, self.evictions_before = 0, self.model.evictions

    def worst_case(self, rows: list[int]) -> int:
        return self.model.worst_case_blocks(rows)

    def finish(self, scenario: str, params: dict, seed: int, num_requests: int) -> Trace:
        model = self.model
        live = {row: model.tables[row] for row in model.tables}
        final_lens = [model.lens.get(row, 0) for row in range(self.config["max_seqs"])]
        ops = {name: self.op.count(code) for code, name in OP_NAMES.items()}
        header = {
            "scenario": scenario,
            "generator_version": GENERATOR_VERSION,
            "params": params,
            "seed": seed,
            "config": self.config,
            "num_steps": len(self.decode_offsets),
            "num_ops": len(self.op),
            "num_requests": num_requests,
            "peak_blocks_in_use": self.peak,
            "cow_count": int(sum(self.step_cows)),
            "preemptions": self.preemptions,
            "final_free": model.num_free_blocks(),
            "live_at_end": len(live),
            "ops_by_kind": ops,
        }
        arrays = {
            "op": self.op, "a0": self.a0, "a1": self.a1,
            "step_offsets": self.step_offsets, "decode_offsets": self.decode_offsets,
            "step_cows": self.step_cows, "final_lens": final_lens,
            "final_canon": canonical_tables(live),
            "hashes": self.hashes, "op_hash": self.op_hash,
            "step_hits": self.step_hits, "step_evictions": self.step_evictions,
        }
        return finalize(header, arrays)


class Scheduler:
    """Continuous batching over rows ``[0, max_seqs)``. Scenarios override :meth:`place` and :meth:`events`.

    ``source(step, want)`` yields the requests that arrive at ``step``; a closed-loop source (an endless
    supply) yields ``want``, enough to fill the free places. ``max_running`` caps concurrency; ``preempt``
    chooses between recompute preemption and an error when the pool cannot hold the running sequences.
    """

    def __init__(self, builder: TraceBuilder, source: Callable[[int, int], Iterator[Request]], max_running: int,
                 preempt: bool) -> None:
        self.b = builder
        self.source = source
        self.max_running = max_running
        self.preempt = preempt
        self.free_rows = list(range(builder.config["max_seqs"] - 1, -1, -1))  # pop() gives the lowest row
        self.running: list[Seq] = []
        self.waiting: deque[Request] = deque()
        self.admissions = 0
        self.requests_seen: set[int] = set()
        self.step = 0
        self.reserve = 0
        self.block_size = builder.config["block_size"]
        self.to_seal: list[Seq] = []  # sequences whose last block the previous decode filled (prefix caching)

    # -- hooks ------------------------------------------------------------------------------------------
    def rows_needed(self, req: Request) -> int:
        return 1

    def place(self, req: Request) -> list[Seq] | None:
        """Admit ``req`` (its rows are available); None when the pool says no."""
        tokens = req.prompt + req.generated
        if req.chain is not None:
            chain = req.chain.blocks(tokens // self.b.model.block_size)
            if not self.b.can_allocate(self.b.cached_need(tokens, chain) + self.reserve + 1):
                return None
            row = self.free_rows.pop()
            self.b.allocate_cached(row, tokens, chain)
            return [Seq(row, req, self.admissions)]
        if not self.b.can_allocate(blocks_for(tokens, self.b.model.block_size) + self.reserve + 1):
            return None
        row = self.free_rows.pop()
        self.b.allocate(row, tokens)
        return [Seq(row, req, self.admissions)]

    def events(self) -> None:
        """Scenario events between admission and decode (beam search)."""

    def finished(self, seq: Seq) -> None:
        """``seq`` generated its whole output and was freed (multi-turn chat schedules the next turn here)."""

    # -- the loop ---------------------------------------------------------------------------------------
    def _release(self, seq: Seq) -> None:
        self.b.free(seq.row)
        self.free_rows.append(seq.row)
        self.free_rows.sort(reverse=True)

    def _reserve_decode(self) -> None:
        while True:
            self.reserve = self.b.worst_case([s.row for s in self.running])
            if self.b.can_allocate(self.reserve):
                return
            if not self.preempt:
                raise ScenarioError(
                    f"step {self.step}: the pool ({self.b.model.num_blocks} blocks) cannot hold the running "
                    "sequences and this scenario does not preempt; raise num_blocks or lower running"
                )
            youngest = max(self.running, key=lambda s: s.admitted)
            self.running.remove(youngest)
            self._release(youngest)
            self.waiting.appendleft(youngest.req)
            self.b.preemptions += 1

    def _admit(self) -> None:
        want = max(0, self.max_running - len(self.running) - len(self.waiting))
        self.waiting.extend(self.source(self.step, want))
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            if len(self.free_rows) < self.rows_needed(req):
                break
            placed = self.place(req)
            if placed is None:
                if not self.running:
                    raise ScenarioError(
                        f"request {req.rid} ({req.prompt} prompt tokens) cannot be admitted even into an "
                        f"empty engine: the pool has {self.b.model.num_blocks} blocks"
                    )
                break
            self.waiting.popleft()
            self.requests_seen.add(req.rid)
            self.admissions += 1
            self.running.extend(placed)
            self.reserve += len(placed)

    def run_step(self) -> None:
        for seq in self.to_seal:
            self.b.seal(seq.row, seq.req.chain.hash((seq.req.prompt + seq.req.generated) // self.block_size - 1))
        for seq in [s for s in self.running if s.req.generated >= s.req.output]:
            self.running.remove(seq)
            self._release(seq)
            self.finished(seq)
        self._reserve_decode()
        self._admit()
        self.events()
        self.running.sort(key=lambda s: s.row)
        self.b.decode([s.row for s in self.running])
        for seq in self.running:
            seq.req.generated += 1
        self.to_seal = [s for s in self.running
                        if s.req.chain is not None and (s.req.prompt + s.req.generated) % self.block_size == 0]
        self.step += 1

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def finish(self, scenario: str, params: dict, seed: int) -> Trace:
        return self.b.finish(scenario, params, seed, len(self.requests_seen))
