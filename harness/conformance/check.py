"""``check(cls)``: run the contract state machine on one implementation and say what it found.

Hypothesis shrinks a failing example to a short sequence of calls and runs that sequence last; the machine
records each call it makes as a line of Python, so the verdict can print the shrunk sequence as a script
that rebuilds the same machine (the class under test next to the reference model) and replays it, raising
the same assertion.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from .machine import CONFIGS, FULL_SWEEP, ContractMachine, contract_machine

DEFAULT_SEEDS = (0,)
MESSAGE_CHARS = 2000  # a failure's message as printed (an implementation's own exception may be far longer)


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
    if "<locals>" in qualname:  # a class made inside a function cannot be imported: say so in the script
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
    except Exception as exc:  # the failure is the result: any exception, including the implementation's own
        steps = list(made[-1].steps) if made else []
        error = f"{type(exc).__name__}: {exc}"
        return Failure(seed, type(exc).__name__, str(exc), steps,
                       render_reproduction(cls, machine.config, steps, error), machine.config)
    return None


def check(cls: type, *, seeds: Iterable[int | None] = DEFAULT_SEEDS, max_examples: int = 100,
          ops: Iterable[str] | None = None, config: dict[str, int] | None = None,
          step_count: int = 40, progress: Callable[[], None] = lambda: None) -> Verdict:
    """Check one BlockManager class against the contract's reference model.

    For each seed (``None``: a random one, reported in the verdict) and each configuration (``config``, or by
    default every one of :data:`~harness.conformance.machine.CONFIGS`: block sizes 1 to 64, pools of a handful
    of blocks and of 65,536), Hypothesis runs random sequences of up to ``step_count`` valid and invalid calls
    restricted to ``ops`` (names from :data:`~harness.conformance.machine.OPS`; default all), ``max_examples``
    per seed shared among the configurations (rounded up; a pool above ``FULL_SWEEP`` blocks gets a quarter
    share), and shrinks the first disagreement it finds. Compared after every call: results, exception types,
    atomicity of failed calls, free counts, ref counts, tables, copy-on-write pairs and slots (up to a renaming
    of block ids), and the batched ``decode_step`` and ``lookup`` against the same calls made one at a time.

    ``progress()`` is called as each example starts (a worker process reports it, so that a long check is not
    taken for a hung one).

    Returns a :class:`Verdict`; on failure ``verdict.reproduction`` is a runnable script (if ``cls`` can be
    imported by its module and name). No example database is read or written: a verdict depends only on
    the class, the seeds and the settings.
    """
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
        deadline=None,  # the first calls of compiled designs load or compile kernels
        database=None,
        verbosity=Verbosity.quiet,  # the verdict carries the reproduction; nothing to print here
        report_multiple_bugs=False,  # one shrunk failure per seed, not an exception group
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
