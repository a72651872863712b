"""What a run measures, as data: the cells and studies of each scenario. Design: docs/measurement.md#matrix."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from harness.base.replay import REGIMES
from harness.errors import InputError
from impls import registry
from scenarios import PAPER

ALL = "*"
SWEEP = "concurrency-*"
CONTEXT = "context-*"
POOL = "pool-*"
SWEEPS = {"context": CONTEXT, "pool": POOL, "concurrency": SWEEP}
SCALE_ONLY = (CONTEXT, POOL, "concurrency-2048", "concurrency-4096")
TRACE = "trace:*"
CACHING = "caching:*"
CACHE_OPS_SCENARIO = "system-prompt-256"


@dataclass(frozen=True)
class CellRule:
    """Implementations of ``roles`` run in ``regimes`` on the scenarios matching ``scenarios``, for at most ``max_reps``
    repetitions (0: the run's ``--reps``)."""

    roles: tuple[str, ...]
    regimes: tuple[str, ...]
    scenarios: tuple[str, ...] = (ALL,)
    max_reps: int = 0
    skip: tuple[str, ...] = ()


CELL_RULES: tuple[CellRule, ...] = (
    CellRule(("design", "twin", "native"), ("batched",)),
    CellRule(("design",), ("per-call",), (PAPER,)),
    CellRule(("contender",), ("batched",), (PAPER,)),
    CellRule(("contender",), ("per-call",), (PAPER,), skip=("sglang",)),
    CellRule(("plugin",), ("batched", "per-call"), (PAPER,)),
    CellRule(("caching", "plugin"), ("batched",), (CACHING,)),
    CellRule(("caching", "contender", "plugin"), ("batched", "per-call"), (CACHE_OPS_SCENARIO,)),
    CellRule(("design", "twin", "contender", "caching", "plugin"), ("step",), (PAPER,)),
)


# The C++ designs replay inside C++ only: another regime would time ctypes, not the design.
ROLE_REGIMES = {"native": ("batched",)}
# step() does not take the prefix-caching ops yet.
PLAIN_ONLY_REGIMES = ("step",)


@dataclass(frozen=True)
class Study:
    """A measurement beyond the timed replays, on the scenarios matching ``scenarios`` (``quick``: in --quick), of the
    measured cells whose implementation has one of ``roles``."""

    name: str
    scenarios: tuple[str, ...]
    quick: tuple[str, ...]
    per_cell: bool
    what: str
    roles: tuple[str, ...] = registry.ROLES
    named: tuple[str, ...] = ()

    def runs_on(self, scenario: str, *, quick: bool, explicit: bool) -> bool:
        """Whether the study measures ``scenario`` in a run of this kind."""
        patterns = self.quick if quick else (self.named or self.scenarios) if explicit else self.scenarios
        return matches(scenario, patterns)


STUDIES: tuple[Study, ...] = (
    Study("allocations", (PAPER, CACHING), (PAPER,), True, "allocation events per step (memray, Numba runtime)",
          named=(ALL,)),
    Study("paced", (PAPER,), (PAPER,), True, "open-loop paced run at the step rate: observed CPU share",
          ("design", "plugin")),
    Study("l1d", (PAPER, TRACE), (PAPER, TRACE), False,
          "L1D misses and instructions (perf, else callgrind simulation; --quick: perf only)",
          ("design", "twin", "native", "caching", "plugin")),
    Study("idwidth", (PAPER,), (PAPER,), False, "block-id width: uint16 / int32 / int64 lookups"),
    Study("cache_state", (PAPER,), (), False,
          "compiled and C++ whole steps replayed alone, warm and with the caches flushed before every slice: "
          "figures independent of the run's other designs; beside batched flat, the minimal decode loop",
          ("design", "twin", "native", "caching", "plugin")),
    Study("table_copy", (PAPER, SWEEP, CONTEXT, POOL), (PAPER,), False,
          "rule 3: block tables to the device, per variant"),
    Study("memory", (ALL,), (ALL,), False,
          "each design's tables and metadata at the trace's peak, bytes (nbytes, memray; --memory, on in --sweep)"),
    Study("cache_ops", (CACHE_OPS_SCENARIO,), (CACHE_OPS_SCENARIO,), False,
          "prefix cache: ns per cached lookup, insert and eviction; bytes per cached block"),
    Study("hashing", (PAPER, CACHING), (PAPER,), False,
          "block hashing as engines do it (vLLM sha256 / cbor / xxhash, builtin hash, nano-vllm xxh64), per block "
          "and per sequence-step of the trace"),
)

SWEEP_STEPS = 500
QUICK_STEPS = 200
QUICK_OVERRIDES = {"azure-code": {"duration_s": 60.0}, "mooncake": {"duration_s": 30.0},
                   "mooncake-cached": {"duration_s": 30.0}}


def default_scenarios(names: Iterable[str]) -> list[str]:
    """The scenarios a run measures when none is named: all but the scale sweeps' own (:data:`SCALE_ONLY`)."""
    return [n for n in names if not matches(n, SCALE_ONLY)]


def sweep_scenarios(families: Sequence[str], names: Iterable[str]) -> list[str]:
    """The scenarios of the scale sweeps ``families`` (keys of :data:`SWEEPS`), in catalogue order."""
    unknown = [f for f in families if f not in SWEEPS]
    if unknown:
        raise InputError(f"--sweep: unknown famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                         f"choose from {', '.join(SWEEPS)}")
    return [n for n in names if matches(n, [SWEEPS[f] for f in families])]


def is_caching(scenario: str) -> bool:
    """Whether the catalogue's ``scenario`` uses prefix caching."""
    from scenarios import SCENARIOS

    return bool(getattr(SCENARIOS.get(scenario), "caching", False))


def matches(scenario: str, patterns: Iterable[str]) -> bool:
    """``scenario`` matches one of ``patterns`` (a name, ``*``, a prefix ending in ``*``, or :data:`CACHING`)."""
    return any(p == scenario or (p == CACHING and is_caching(scenario))
               or (p.endswith("*") and p != CACHING and scenario.startswith(p[:-1])) for p in patterns)


def supports_caching(impl: str) -> bool:
    """Whether the implementation's class implements prefix caching (False when it cannot be imported)."""
    from impls.contract import supports_prefix_caching

    try:
        cls = registry.BY_NAME[impl].load() if impl in registry.BY_NAME else registry.load_plugin(impl)
    except (ImportError, AttributeError, registry.PluginError):
        return False
    return supports_prefix_caching(cls)


def overrides(scenario: str, quick: bool) -> dict:
    """Scenario parameters the bench sets on top of the scenario's defaults."""
    if quick:
        return dict(QUICK_OVERRIDES.get(scenario, {"steps": QUICK_STEPS}))
    if matches(scenario, (SWEEP,)):
        return {"steps": SWEEP_STEPS}
    return {}


def _rules(scenario: str, impl: str, regime: str) -> list[CellRule]:
    return [rule for rule in CELL_RULES if registry.record(impl).role in rule.roles and regime in rule.regimes
            and impl not in rule.skip and matches(scenario, rule.scenarios)]


def default_cells(scenario: str, impls: Sequence[str], regimes: Sequence[str],
                  caching: Callable[[str], bool] = supports_caching) -> list[tuple[str, str]]:
    """The (impl, regime) cells the default matrix measures on ``scenario``, in registry-then-regime order
    (``caching(impl)``: whether it has prefix caching)."""
    cached = is_caching(scenario)
    return [(impl, regime) for impl in impls for regime in regimes
            if _rules(scenario, impl, regime) and (not cached or caching(impl))]


def rep_caps(scenario: str, cells: Sequence[tuple[str, str]]) -> list[list]:
    """``[impl, regime, n]`` for the cells the default matrix runs for at most ``n`` repetitions."""
    caps = []
    for impl, regime in cells:
        limits = [rule.max_reps for rule in _rules(scenario, impl, regime)]
        if limits and all(limits):
            caps.append([impl, regime, max(limits)])
    return caps


OWN_STUDIES = ("idwidth", "hashing", "table_copy")  # run once per scenario, in the worker of no implementation


@dataclass
class ScenarioPlan:
    """Everything one scenario of a run measures."""

    scenario: str
    overrides: dict
    cells: list[tuple[str, str]]
    studies: list[str] = field(default_factory=list)
    max_reps: list[list] = field(default_factory=list)

    def reps_of(self, cell: tuple[str, str], reps: int) -> int:
        """Repetitions of ``cell`` in a run of ``reps``."""
        return min([reps, *(n for i, r, n in self.max_reps if (i, r) == tuple(cell))])

    def study_cells(self, study: str, cells: Sequence[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
        """Of ``cells`` (default: the plan's), those ``study`` measures (its roles)."""
        roles = {s.name: s for s in STUDIES}[study].roles
        return [c for c in (self.cells if cells is None else cells) if registry.record(c[0]).role in roles]

    def units(self, reps: int) -> int:
        """Progress units: one per cell and repetition, one per cell of per-cell studies, one per other study in
        each implementation's worker (in the worker of none for :data:`OWN_STUDIES`)."""
        by_name = {s.name: s for s in STUDIES}
        workers = len({impl for impl, _ in self.cells})
        return (sum(self.reps_of(c, reps) for c in self.cells)
                + sum(len(self.study_cells(s)) if by_name[s].per_cell else 1 if s in OWN_STUDIES else workers
                      for s in self.studies))


def plan_scenario(scenario: str, impls: Sequence[str], regimes: Sequence[str], *, explicit: bool, quick: bool,
                  enabled: Iterable[str], caching: Callable[[str], bool] = supports_caching) -> ScenarioPlan:
    """The plan of one scenario: its cells (all named ones when ``explicit``, for ``--reps`` repetitions each) and its
    enabled studies (``caching(impl)``: whether it has prefix caching)."""
    cells = ([(i, r) for i in impls for r in regimes] if explicit
             else default_cells(scenario, impls, regimes, caching))
    if is_caching(scenario):
        cells = [(i, r) for i, r in cells if caching(i) and r not in PLAIN_ONLY_REGIMES]
    cells = [(i, r) for i, r in cells if r in ROLE_REGIMES.get(registry.record(i).role, REGIMES)]
    wanted = set(enabled)
    studies = [s.name for s in STUDIES
               if s.name in wanted and s.runs_on(scenario, quick=quick, explicit=explicit)]
    return ScenarioPlan(scenario, overrides(scenario, quick), cells, studies,
                        [] if explicit else rep_caps(scenario, cells))


def describe() -> str:
    """The default matrix in words (for ``--help`` and the docs)."""
    lines = ["default matrix (cells):"]
    for rule in CELL_RULES:
        where = "every scenario" if rule.scenarios == (ALL,) else ", ".join(rule.scenarios)
        reps = f" ({rule.max_reps} repetition(s) at most)" if rule.max_reps else ""
        skip = f" (except {', '.join(rule.skip)})" if rule.skip else ""
        lines.append(f"  {'/'.join(rule.roles)}{skip}: {', '.join(rule.regimes)} on {where}{reps}")
    lines.append(f"  left out of the default run: {', '.join(SCALE_ONLY)} (the scale sweeps: --sweep "
                 f"{','.join(SWEEPS)}, each family's scenarios under the rules above)")
    lines.append("studies (scenarios; in --quick):")
    every_role = Study.__dataclass_fields__["roles"].default
    for s in STUDIES:
        roles = "" if s.roles == every_role else f" (cells of {'/'.join(s.roles)} only)"
        named = f" (named scenarios: {', '.join(s.named)})" if s.named else ""
        lines.append(f"  {s.name}: {', '.join(s.scenarios)}{named}; {', '.join(s.quick) or 'none'}{roles} -- {s.what}")
    return "\n".join(lines)
