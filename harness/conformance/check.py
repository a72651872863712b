"""``check(cls)``: the contract state machine run on one class, and its verdict. Design: docs/measurement.md#check."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from .machine import CONFIGS, FULL_SWEEP, ContractMachine, contract_machine

DEFAULT_SEEDS = (0,)
MESSAGE_CHARS = 2000


@dataclass
class Failure:
    """One failing run: the seed, the error and the shrunk calls (``steps``, lines of Python)."""

    seed: int
    error_type: str
    message: str
    steps: list[str]
    reproduction: str
    config: dict[str, int] = field(default_factory=dict)

    @property
    def calls(self) -> list[str]:
        """The contract calls of ``steps``, without the state comparisons between them."""
        return [step for step in self.steps if step != "state.same_state()"]

    def __str__(self) -> str:
        where = f", block size {self.config['block_size']}, {self.config['num_blocks']} blocks" if self.config else ""
        return f"seed {self.seed}{where}: {self.error_type}: {_cut(self.message)} (after {len(self.calls)} calls)"


def _cut(text: str) -> str:
    """``text`` cut to :data:`MESSAGE_CHARS` characters."""
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


@dataclass
class Verdict:
    """What :func:`check` found. ``ok`` is True when no seed found a disagreement with the model."""

    impl: str
    ok: bool
    seeds: list[int]
    failures: list[Failure] = field(default_factory=list)

    @property
    def reproduction(self) -> str | None:
        """The shortest failing call sequence over all seeds, as runnable Python; None when ``ok``."""
        if not self.failures:
            return None
        return min(self.failures, key=lambda f: len(f.calls)).reproduction

    def __str__(self) -> str:
        head = f"{self.impl}: {'conforms' if self.ok else 'FAILS'} (seeds {self.seeds})"
        if self.ok:
            return head
        return "\n".join([head, *(f"  {f}" for f in self.failures), "", "Reproduction:", self.reproduction or ""])


def _importable(cls: type) -> tuple[str, str]:
    """(import line, expression naming the class) for the reproduction."""
    qualname = cls.__qualname__
    if "<locals>" in qualname:
        return (f"# {cls.__module__}.{qualname} is local to a function: define it here as Impl", "Impl")
    return f"from {cls.__module__} import {qualname.split('.')[0]}", qualname


def render_reproduction(cls: type, config: dict[str, int], steps: list[str], error: str) -> str:
    """A script that rebuilds the machine for ``cls`` and replays ``steps`` (it raises ``error`` again)."""
    import_line, name = _importable(cls)
    return "\n".join([
        f"# {cls.__module__}.{cls.__qualname__} disagrees with the contract's reference model "
        "(impls/core/reference.py).",
        "# The machine below holds a fresh instance next to the model; each call runs on both and compares them,",
        "# same_state() compares free counts, tables and ref counts (harness.conformance). The last line raises",
        f"# {_cut(error.splitlines()[0]) if error else ''}",
        "from harness.conformance import contract_machine",
        import_line,
        "",
        f"state = contract_machine({name}, config={config!r})()",
        *steps,
        "",
    ])


def _run_one(cls: type, machine: type[ContractMachine], seed: int, run_settings: settings,
             progress: Callable[[], None] = lambda: None) -> Failure | None:
    made: list[ContractMachine] = []

    class Recorded(machine):  # keeps the last machine made: Hypothesis runs the shrunk example last
        def __init__(self) -> None:
            progress()
            super().__init__()
            made.append(self)
            del made[:-1]

    Recorded.__name__ = Recorded.__qualname__ = machine.__name__
    try:
        run_state_machine_as_test(hypothesis_seed(seed)(Recorded), settings=run_settings)
    except Exception as exc:
        steps = list(made[-1].steps) if made else []
        error = f"{type(exc).__name__}: {exc}"
        return Failure(seed, type(exc).__name__, str(exc), steps,
                       render_reproduction(cls, machine.config, steps, error), machine.config)
    return None


def check(cls: type, *, seeds: Iterable[int | None] = DEFAULT_SEEDS, max_examples: int = 100,
          ops: Iterable[str] | None = None, config: dict[str, int] | None = None,
          step_count: int = 40, progress: Callable[[], None] = lambda: None) -> Verdict:
    """Check one BlockManager class against the contract's reference model."""
    configs = CONFIGS if config is None else (config,)
    share = -(-max_examples // len(configs))
    used = [random.randrange(2**32) if s is None else int(s) for s in seeds]
    runs = [(contract_machine(cls, c, ops), _settings(share if c["num_blocks"] <= FULL_SWEEP else share // 4,
                                                      step_count)) for c in configs]
    failures = [f for f in (_first_failure(cls, runs, s, progress) for s in used) if f is not None]
    return Verdict(f"{cls.__module__}.{cls.__qualname__}", not failures, used, failures)


def _settings(max_examples: int, step_count: int) -> settings:
    return settings(
        max_examples=max(1, max_examples),
        stateful_step_count=step_count,
        deadline=None,
        database=None,
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow],
    )


def _first_failure(cls: type, runs: list[tuple[type[ContractMachine], settings]], seed: int,
                   progress: Callable[[], None]) -> Failure | None:
    """One seed's run over the configurations in order, up to the first that fails."""
    for machine, run_settings in runs:
        failure = _run_one(cls, machine, seed, run_settings, progress)
        if failure is not None:
            return failure
    return None
