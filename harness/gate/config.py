"""The gate's rules, read from a TOML file: ``[tool.kvblock-bench.gate]`` in a ``pyproject.toml``.
Design: docs/output.md#harnessgateconfigpy."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from harness.base.replay import REGIMES
from harness.errors import InputError
from impls import REGISTRY, registry
from impls.registry import RATIO_BASE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (tomli is a dependency there)
    import tomli as tomllib

TABLE = "[tool.kvblock-bench.gate]"
DEFAULT_TOLERANCE_PCT = 1.0
# ab: NEW's counts above BASE's by more than this fail (docs/ci.md#kvblock-bench-ab).
DEFAULT_COUNTS_THRESHOLD_PCT = 2.0


@dataclass(frozen=True)
class Rule:
    """What the gate demands of one (impl, regime) cell."""

    impl: str
    regime: str
    max_instructions_per_seq_step: float | None = None
    min_instructions_vs_base: float | None = None
    zero_allocations: bool = False
    max_instructions_vs_base: float | None = None

    @property
    def cell(self) -> tuple[str, str]:
        return (self.impl, self.regime)


@dataclass(frozen=True)
class WallRule:
    """``slower``'s batched step over ``faster``'s, by the clock in one process, must be at least ``min_ratio``."""

    slower: str
    faster: str
    min_ratio: float


@dataclass(frozen=True)
class GateConfig:
    """The gate's configuration; ``source`` says where it came from (or that none was found)."""

    source: str
    rules: tuple[Rule, ...] = ()
    wall: WallRule | None = None
    tolerance_pct: float = DEFAULT_TOLERANCE_PCT
    impls: tuple[str, ...] = ()
    counts_threshold_pct: float = DEFAULT_COUNTS_THRESHOLD_PCT

    def rule(self, cell: tuple[str, str]) -> Rule | None:
        return next((r for r in self.rules if r.cell == cell), None)


def find_config(start: Path | None = None) -> Path | None:
    """The closest ``pyproject.toml`` from ``start`` (default: the current directory) upward that has the table."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        path = folder / "pyproject.toml"
        if path.is_file() and _gate_table(_read(path), path) is not None:
            return path
    return None


def load_config(path: Path | None = None) -> GateConfig:
    """The gate's configuration from ``path``, else from :func:`find_config`; no rules when none is found."""
    if path is None:
        path = find_config()
        if path is None:
            return GateConfig(f"no {TABLE} in a pyproject.toml from {Path.cwd()} upward: no rules")
    table = _gate_table(_read(path), path)
    if table is None:
        raise InputError(f"{path}: no {TABLE} table; see `kvblock-bench gate --help` for its keys")
    return parse(table, f"{path} {TABLE}")


def _read(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InputError(f"--config {path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None


def _gate_table(doc: dict, path: Path) -> dict | None:
    table = doc.get("tool", {}).get("kvblock-bench", {}).get("gate")
    if table is not None and not isinstance(table, dict):
        raise InputError(f"{path}: {TABLE} must be a table")
    return table


def _number(where: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: {key} must be a non-negative number, got {value!r}")
    return float(value)


def _name(where: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: {key} must be an implementation name (a string), got {value!r}")
    return value


def _known_keys(where: str, table: object, known: tuple[str, ...]) -> dict:
    if not isinstance(table, dict):
        raise InputError(f"{where}: must be a table, got {table!r}")
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(known)}")
    return table


LIMITS = ("max_instructions_per_seq_step", "min_instructions_vs_base", "max_instructions_vs_base")


def parse_rule(where: str, table: object) -> Rule:
    """One ``[[...gate.rule]]`` table."""
    known = tuple(f.name for f in fields(Rule))
    table = _known_keys(where, table, known)
    for key in ("impl", "regime"):
        if key not in table:
            raise InputError(f"{where}: {key} is required")
    regime = table["regime"]
    if regime not in REGIMES:
        raise InputError(f"{where}: regime {regime!r}; the gate measures {', '.join(REGIMES)}")
    zero = table.get("zero_allocations", False)
    if not isinstance(zero, bool):
        raise InputError(f"{where}: zero_allocations must be true or false, got {zero!r}")
    limits = {k: _number(where, k, table[k]) for k in LIMITS if k in table}
    if not limits and not zero:
        raise InputError(f"{where}: a rule needs {', '.join(LIMITS)} or zero_allocations = true")
    rule = Rule(_name(where, "impl", table["impl"]), regime, zero_allocations=zero, **limits)
    why = idle_rule(rule)
    if why:
        raise InputError(f"{where}: {why}; a rule that cannot fail guards nothing")
    return rule


BASE_CELL = (RATIO_BASE, "batched")  # what the rules' ``..._vs_base`` limits divide by (the gate's BASE)
# The regimes whose instructions the gate counts (counting `step` would add a callgrind process per design).
COUNTED_REGIMES = ("batched", "per-call")


def idle_rule(rule: Rule) -> str:
    """Why ``rule`` can never fail (or never pass), in words; "" when it can do both."""
    for key in LIMITS:
        if getattr(rule, key) == 0:
            return f"{key} = 0 (must be above 0)"
    if rule.regime not in COUNTED_REGIMES:
        return f"regime {rule.regime!r}: the gate counts {' and '.join(COUNTED_REGIMES)} only"
    if rule.regime != "batched" and rule.impl in REGISTRY and registry.record(rule.impl).role == "native":
        return f"{rule.impl} {rule.regime}: the gate counts the C++ designs batched only"
    against_base = [k for k in ("min_instructions_vs_base", "max_instructions_vs_base") if getattr(rule, k) is not None]
    if rule.cell == BASE_CELL and against_base:
        return f"{against_base[0]} on {RATIO_BASE} batched itself (its ratio to itself is always 1)"
    return ""


def parse(table: dict, where: str) -> GateConfig:
    """The gate's configuration from its TOML table (``where`` names it in errors)."""
    table = _known_keys(where, table, ("impls", "tolerance_pct", "counts_threshold_pct", "rule", "wall"))
    rules_table = table.get("rule", [])
    if not isinstance(rules_table, list):
        raise InputError(f"{where}: rule must be an array of tables ([[tool.kvblock-bench.gate.rule]])")
    rules = tuple(parse_rule(f"{where} rule {i + 1}", r) for i, r in enumerate(rules_table))
    cells = [r.cell for r in rules]
    repeated = sorted({c for c in cells if cells.count(c) > 1})
    if repeated:
        raise InputError(f"{where}: two rules for {repeated[0][0]} {repeated[0][1]}; give each cell one rule")
    wall = None
    if "wall" in table:
        w = _known_keys(f"{where} wall", table["wall"], ("slower", "faster", "min_ratio"))
        missing = [k for k in ("slower", "faster", "min_ratio") if k not in w]
        if missing:
            raise InputError(f"{where} wall: {missing[0]} is required")
        wall = WallRule(_name(f"{where} wall", "slower", w["slower"]), _name(f"{where} wall", "faster", w["faster"]),
                        _number(f"{where} wall", "min_ratio", w["min_ratio"]))
        if wall.min_ratio == 0:
            raise InputError(f"{where} wall: min_ratio = 0 cannot fail (every ratio is above 0); give the ratio the "
                             "slower design's step must reach, e.g. 3")
        if wall.slower == wall.faster:
            raise InputError(f"{where} wall: slower and faster are both {wall.slower!r}; a design's ratio to itself "
                             "is 1 whatever it does")
    impls = table.get("impls", [])
    if not isinstance(impls, list) or not all(isinstance(i, str) and i for i in impls):
        raise InputError(f"{where}: impls must be a list of implementation names, got {impls!r}")
    tolerance = _number(where, "tolerance_pct", table.get("tolerance_pct", DEFAULT_TOLERANCE_PCT))
    counts = _number(where, "counts_threshold_pct", table.get("counts_threshold_pct", DEFAULT_COUNTS_THRESHOLD_PCT))
    return GateConfig(where, rules, wall, tolerance, tuple(impls), counts)
