"""Figures quoted in the docs' prose, each rendered from the committed file or the code constant it comes from.

A page holds a fact as ``<!-- fact:NAME -->text<!-- /fact -->``; ``python -m harness.facts`` rewrites every
text from its source, ``--check`` lists the stale ones, and tests/test_docs_facts.py fails on any (and on a
figure typed by hand outside a fact or a generated section). Design: docs/output.md#harnessfactspy."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.base.project import ROOT
from harness.output import sections

FACT = re.compile(r"<!-- fact:([a-z][\w.:-]*) -->(.*?)<!-- /fact -->")  # lower case: ``fact:NAME`` is prose about it
REFERENCE = "results/reference"


class FactError(ValueError):
    """A page names a fact this module does not know, or a source that cannot give it."""


@dataclass(frozen=True)
class Fact:
    """Where a figure comes from (a committed file, or code) and how it is written into a page."""

    source: str
    render: Callable[[Path], str]


FACTS: dict[str, Fact] = {}


def _add(name: str, source: str, render: Callable[[Path], str]) -> None:
    FACTS[name] = Fact(source, render)


# -- sources ----------------------------------------------------------------------------------------------------
@cache
def _run(root: Path, folder: str):
    from harness.output.rundata import RunData

    return RunData.load(root / folder)


def _json(root: Path, path: str) -> dict:
    return json.loads((root / path).read_text(encoding="utf-8"))


def _row(root: Path, key: tuple[str, str, str, str], folder: str = REFERENCE) -> dict:
    row = _run(root, folder).get(*key)
    if row is None or row.get("status") != "ok":
        raise FactError(f"{folder}/results.csv has no measured row {'/'.join(key)}")
    return row


def _fmt(value: float, digits: int = 3) -> str:
    from harness.output.formatting import fmt

    return fmt(float(value), digits)


def _with_interval(row: dict, unit: str = "") -> str:
    from harness.output.formatting import interval_text

    return f"{_fmt(row['value'])}{unit}{interval_text(row)}"


def figure(name: str, key: tuple[str, str, str, str], style: str = "value", unit: str = "",
           folder: str = REFERENCE) -> None:
    """A row of a committed run: ``value`` (and ``unit``), ``interval`` (with its interval) or ``ratio`` (``R×``)."""
    def render(root: Path) -> str:
        row = _row(root, key, folder)
        if style == "value":
            return f"{_fmt(row['value'])}{unit}"
        return _with_interval(row, "×" if style == "ratio" else unit)

    _add(name, f"{folder}/results.csv: {'/'.join(key)}", render)


def constant(name: str, module: str, attr: str, show: Callable[[object], str] = str) -> None:
    """A named constant of the code, written by ``show``."""
    def render(root: Path) -> str:
        return show(getattr(__import__(module, fromlist=[attr]), attr))

    _add(name, f"{module}.{attr}", render)


def _parser():
    from harness.cli import build_parser

    return build_parser()


def _subparsers() -> dict:
    import argparse

    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flag_default(command: str, flag: str) -> str:
    """The default of ``kvblock-bench COMMAND``'s ``flag`` (a list joined by commas, a number as written)."""
    parser = _subparsers()[command]
    for action in parser._actions:
        if flag in action.option_strings:
            value = action.default
            return ",".join(map(str, value)) if isinstance(value, list | tuple) else f"{value:g}" if isinstance(
                value, float) else str(value)
    raise FactError(f"kvblock-bench {command} has no option {flag}")


def _family(name: str) -> Fact | None:
    """Facts named by their source: ``default:COMMAND:--flag``."""
    kind, _, rest = name.partition(":")
    if kind == "default":
        command, _, flag = rest.partition(":")
        return Fact(f"kvblock-bench {command} {flag}", lambda root: flag_default(command, flag))
    return None


def lookup(name: str) -> Fact:
    found = FACTS.get(name) or _family(name)
    if found is None:
        raise FactError(f"no fact named {name!r} (harness/facts.py lists them)")
    return found


def _run_config_default(field: str) -> object:
    from harness.run.runner import RunConfig

    return RunConfig.__dataclass_fields__[field].default


# -- the facts the pages quote ----------------------------------------------------------------------------------
_add("subcommands", "harness/cli.py: build_parser", lambda root: ", ".join(f"`{n}`" for n in _subparsers()))
for _name, _attr in (("usage", "EXIT_USAGE"), ("interrupted", "EXIT_INTERRUPTED"),
                     ("failed-cells", "EXIT_FAILED_CELLS")):
    constant(f"exit.{_name}", "harness.cli", _attr)
_add("exit.bug", "Python: an exception nothing catches ends the process with status 1", lambda root: "1")
constant("exit.does-not-conform", "harness.cli", "EXIT_DOES_NOT_CONFORM")
constant("exit.compare-fails", "harness.output.compare", "EXIT_FAILS")
constant("exit.nothing-comparable", "harness.output.compare", "EXIT_NOTHING_COMPARABLE")
constant("exit.gate-fail", "harness.gate.command", "EXIT_FAIL")
constant("exit.gate-unmeasured", "harness.gate.command", "EXIT_UNMEASURED")
constant("paced.reps", "harness.studies.paced_study", "PACED_REPS")
constant("ab.reps", "harness.ci.ab", "AB_REPS")
constant("ab.quick-reps", "harness.ci.ab", "AB_QUICK_REPS")
constant("ab.min-pairs", "harness.output.compare", "MIN_PAIRS")
constant("ab.counts-threshold", "harness.gate.config", "DEFAULT_COUNTS_THRESHOLD_PCT", lambda v: f"{v:g} %")
constant("exit.too-few-pairs", "harness.errors", "EXIT_TOO_FEW_PAIRS")
constant("interrupt.grace", "harness.base.interrupts", "GRACE_S", lambda v: f"{v:g} s")
constant("precheck.form", "harness.run.precheck", "QUICK",
         lambda q: f"{q.seeds} seed of {q.examples} random call sequences of up to {q.ops} calls")
constant("slices", "harness.base.interleave", "SLICES_PER_REP")
constant("oncpu.slack", "harness.base.oncpu", "SLACK_NS", lambda v: f"{v / 1000:g} µs")
constant("oncpu.fraction", "harness.base.oncpu", "FRACTION", lambda v: f"{v * 100:g} %")
constant("host.on-cpu-min", "harness.base.host", "ON_CPU_MIN_PCT", lambda v: f"{v:g} %")
constant("host.steal-max", "harness.base.host", "STEAL_MAX_PCT", lambda v: f"{v:g} %")
constant("host.latency-moved", "harness.base.host", "LATENCY_MOVED", lambda v: f"{v:g}×")
constant("spread-target", "harness.output.overlap", "SPREAD_TARGET", lambda v: f"{v:g}x")
constant("fast-reps", "harness.base.interleave", "FAST_REPS")
constant("resamples", "harness.base.stats", "RESAMPLES", lambda v: f"{v:,}")
constant("cache-state.reps", "harness.studies.cache_state", "REPS")
constant("cache-state.evict", "harness.studies.cache_state", "EVICT_BYTES", lambda v: f"{v >> 20} MiB")
constant("ab.threshold", "harness.ci.ab", "AB_THRESHOLD_PCT", lambda v: f"{v:g} %")
constant("compare.threshold", "harness.output.compare", "DEFAULT_THRESHOLD_PCT", lambda v: f"{v:g} %")
_add("run.reps", "harness/run/runner.py: RunConfig.reps", lambda root: str(_run_config_default("reps")))


def _calibration(key: str, unit: str, digits: int = 3) -> Callable[[Path], str]:
    return lambda root: f"{_fmt(_json(root, f'{REFERENCE}/meta.json')['calibration'][key], digits)} {unit}"


_add("ref.tsc-tick", f"{REFERENCE}/meta.json: calibration.tsc_ns_per_tick", _calibration("tsc_ns_per_tick", "ns"))
_add("ref.compiled-timer", f"{REFERENCE}/meta.json: calibration.compiled_timer_ns",
     _calibration("compiled_timer_ns", "ns"))
_add("ref.python-timer", f"{REFERENCE}/meta.json: calibration.python_timer_ns",
     _calibration("python_timer_ns", "ns"))
figure("ref.aa", ("paper", "flat", "batched", "aa_ratio"), "ratio")
constant("limit.target", "harness.studies.limit_loop", "TARGET_NS", lambda v: f"{v:g} ns")
for _impl in ("flat", "cpp-flat"):
    figure(f"ref.{_impl}.instructions", ("paper", _impl, "batched", "instructions_per_seq_step"))
    figure(f"ref.{_impl}.warm", ("paper", _impl, "batched", "seq_step_alone_warm_ns"), unit=" ns")
figure("ref.flat.cold", ("paper", "flat", "batched", "seq_step_alone_cold_ns"), unit=" ns")
for _metric in ("seq_step", "lookup", "alloc_free"):
    _short = _metric.replace("_", "-")
    figure(f"ref.cpp-flat.{_short}", ("paper", "cpp-flat", "batched", f"{_metric}_ns_vs_flat"), "ratio")
    figure(f"ref.flat-rows.{_short}", ("paper", "flat-rows", "batched", f"{_metric}_ns_vs_flat"), "value", "×")
figure("ref.flat-rows.l1d", ("paper", "flat-rows", "batched", "l1d_misses_per_seq_step"))
figure("ref.flat.l1d", ("paper", "flat", "batched", "l1d_misses_per_seq_step"))
for _name, _yard in (("limit", "limit"), ("unchecked", "unchecked")):
    figure(f"ref.{_name}.warm", ("paper", "-", "-", f"seq_step_{_yard}_warm_ns"), unit=" ns")
    figure(f"ref.flat.vs-{_name}.warm", ("paper", "flat", "batched", f"seq_step_alone_warm_vs_{_yard}"), "ratio")
for _impl in ("flat", "flat-rows"):
    for _state in ("warm", "cold"):
        figure(f"ref.{_impl}.vs-cpp.{_state}", ("paper", _impl, "batched", f"seq_step_alone_{_state}_vs_cpp"), "ratio")
constant("twin.target", "harness.studies.twin_pair", "TARGET", lambda v: f"{v:g}×")
figure("ref.flat.vs-limit.cold", ("paper", "flat", "batched", "seq_step_alone_cold_vs_limit"), "value", "×")
figure("ref.paced.above-floor", ("paper", "flat", "batched", "paced_above_floor_pct"), "interval", " points")


def _caching(root: Path, metric: str, impl: str | None = None) -> dict[str, float]:
    """``metric`` of the reference's caching rows, per implementation (or, with ``impl``, per scenario)."""
    df = _run(root, REFERENCE).df
    rows = df[(df.metric == metric) & (df.status == "ok") & ((df.impl == impl) if impl else True)]
    return {(r.scenario if impl else r.impl): float(r.value) for r in rows.itertuples()}


def _hit_rates(root: Path) -> str:
    rates = _caching(root, "cache_hit_tokens_pct", "flat-pc") | _caching(root, "cache_hit_tokens_pct", "vllm-v1-pc")
    return f"{min(rates.values()):.0f} % to {max(rates.values()):.0f} %"


def _over(root: Path, metric: str, slow: tuple[str, ...], fast: str) -> str:
    """How many times ``fast``'s ``metric`` each of ``slow`` costs: ``R×`` or ``R1-R2×``."""
    values = _caching(root, metric)
    ratios = sorted(values[s] / values[fast] for s in slow)
    return f"{ratios[0]:.3g}×" if len(ratios) == 1 else f"{ratios[0]:.3g}-{ratios[-1]:.3g}×"


def _ci_cost(part: str, key: str) -> Callable[[Path], str]:
    from harness.base.text import duration_text

    return lambda root: duration_text(_json(root, CI_COST)[part][key])


def _ci_run_ab_args(root: Path) -> str:
    """The ab options .ci/run gives scripts/ci_compare.sh for its same-commit pair."""
    found = re.search(r'KVB_CI_AB_ARGS="\$\{KVB_CI_AB_ARGS:-([^}"]*)\}"', (root / ".ci/run").read_text())
    if not found:
        raise FactError(".ci/run: no KVB_CI_AB_ARGS default")
    return f"`{found.group(1)}`"


CI_COST = "results/compare_pairs/ci_cost.json"
_add("ci-cost.machine", f"{CI_COST}: machine", lambda root: _json(root, CI_COST)["machine"])
_add("ci-cost.script", f"{CI_COST}: ci_compare.wall_s", _ci_cost("ci_compare", "wall_s"))
_add("ci-cost.ab", f"{CI_COST}: ci_compare.ab_s", _ci_cost("ci_compare", "ab_s"))
_add("ci-cost.run", f"{CI_COST}: run.wall_s", _ci_cost("run", "wall_s"))
_add("ci-run.ab-args", ".ci/run: KVB_CI_AB_ARGS", _ci_run_ab_args)


PACED_FLOOR = "results/paced_floor/paced_floor.txt"


def _paced_floor(root: Path) -> dict[str, list[float]]:
    """scripts/paced_floor.py's output: per kind, hot us per repetition (``KIND.hot``), ``median`` and ``range``."""
    out: dict[str, list[float]] = {}
    for line in (root / PACED_FLOOR).read_text().splitlines():
        rep = re.match(r"rep \d+ (\w+)\s+hot\s+([-\d.]+) us .*paced\s+([-\d.]+) us", line)
        summary = re.match(r"paced (\w+)\s+median\s+([-\d.]+) % .*range\s+([-\d.]+)-\s*([-\d.]+) % \((\d+) rep", line)
        if rep:
            out.setdefault(f"{rep.group(1)}.hot", []).append(float(rep.group(2)))
        elif summary:
            kind = summary.group(1)
            out[f"{kind}.median"] = [float(summary.group(2))]
            out[f"{kind}.range"] = [float(summary.group(3)), float(summary.group(4))]
            out["reps"] = [float(summary.group(5))]
    return out


def _paced_floor_fact(key: str, show: Callable[[list[float]], str]) -> None:
    def render(root: Path) -> str:
        values = _paced_floor(root).get(key)
        if not values:
            raise FactError(f"{PACED_FLOOR}: no {key}")
        return show(values)

    _add(f"paced-floor.{key}", f"{PACED_FLOOR}: {key}", render)


for _kind in ("step", "kernel", "noop"):
    _paced_floor_fact(f"{_kind}.hot", lambda v: f"{min(v):g}-{max(v):g} us")
    _paced_floor_fact(f"{_kind}.median", lambda v: f"{v[0]:g} %")
    _paced_floor_fact(f"{_kind}.range", lambda v: f"{v[0]:g} to {v[1]:g} %")
_paced_floor_fact("reps", lambda v: f"{v[0]:g}")


def _processes(folder: str, what: str) -> Callable[[Path], str]:
    """results/processes/FOLDER: its scenario's wall time, or the median high/low of its batched seq-step ratios."""
    def render(root: Path) -> str:
        df = _run(root, f"results/processes/{folder}").df
        ok = df[df.status == "ok"]
        if what == "wall":
            return f"{ok[ok.metric == 'scenario_wall_s'].value.iloc[0]:.0f} s"
        rows = ok[(ok.metric == "seq_step_ns_vs_flat") & (ok.regime == "batched")]
        return f"{(rows.ci_high / rows.ci_low).median():.2f}×"

    return render


for _folder in ("one", "three"):
    _add(f"processes.{_folder}.wall", f"results/processes/{_folder}/results.csv: scenario_wall_s",
         _processes(_folder, "wall"))
    _add(f"processes.{_folder}.width", f"results/processes/{_folder}/results.csv: batched seq_step_ns_vs_flat "
         "intervals, median high/low", _processes(_folder, "width"))


def _make_took(target: str) -> Callable[[Path], str]:
    def render(root: Path) -> str:
        from harness.output.times import read_times, took

        times = read_times(root / "results/times/times.json")
        return took(times.get(target) if times else None)

    return render


_add("make-time.bench", "results/times/times.json: bench", _make_took("bench"))


def _wall(scenario: str) -> Callable[[Path], str]:
    return lambda root: f"{_row(root, (scenario, '-', '-', 'scenario_wall_s'))['value']:,.0f} s"


_add("ref.wall.paper", f"{REFERENCE}/results.csv: paper/-/-/scenario_wall_s", _wall("paper"))


def quote(name: str, path: str, pattern: str) -> None:
    """A figure a committed file states: the first group of ``pattern`` in ``path``."""
    def render(root: Path) -> str:
        found = re.search(pattern, (root / path).read_text(encoding="utf-8"))
        if not found:
            raise FactError(f"{path}: nothing matches {pattern!r}")
        return found.group(1)

    _add(name, f"{path}: {pattern}", render)


quote("gate.split-spread", "tests/test_gate.py", r"measured: up to ([\d.]+ %)")
quote("pairs.passes", "scripts/compare_pairs.py", r'"--passes", type=float, default=([\d.]+)')


def _gate_rule(impl: str, key: str, show: Callable[[float], str]) -> Callable[[Path], str]:
    """A value of this repository's gate rules (pyproject.toml, [tool.kvblock-bench.gate])."""
    def render(root: Path) -> str:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        gate = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["kvblock-bench"]["gate"]
        table = gate["wall"] if impl == "wall" else next(r for r in gate["rule"] if r["impl"] == impl)
        return show(table[key])

    return render


for _fact, _impl, _key, _show in (("gate.flat.max-instructions", "flat", "max_instructions_per_seq_step", "{:g}"),
                                  ("gate.cpp-flat.vs-base", "cpp-flat", "max_instructions_vs_base", "{:g}×"),
                                  ("gate.dict.min-vs-base", "dict", "min_instructions_vs_base", "{:g}×"),
                                  ("gate.wall.min-ratio", "wall", "min_ratio", "{:g}×")):
    _add(_fact, f"pyproject.toml: [tool.kvblock-bench.gate] {_impl} {_key}", _gate_rule(_impl, _key, _show.format))
constant("gate.tolerance", "harness.gate.config", "DEFAULT_TOLERANCE_PCT", lambda v: f"{v:g} %")
constant("bound.fraction", "harness.run.bound", "FRACTION", lambda v: f"{v * 100:g} %")
constant("bound.compiled-fraction", "harness.run.bound", "COMPILED_FRACTION", lambda v: f"{v * 100:g} %")
constant("bound.floor-factor", "harness.run.bound", "FLOOR_FACTOR", lambda v: f"{v:g}")
constant("bound.slack", "harness.run.bound", "SLACK_NS", lambda v: f"{v / 1000:g} us")
constant("stats.trim", "harness.base.stats", "TRIM", lambda v: f"{v * 100:g} %")
constant("stats.trim-from", "harness.base.stats", "TRIM_FROM")
constant("stats.spike", "harness.base.stats", "SPIKE_FACTOR", lambda v: f"{v:g}")
figure("ref.flat.seq-step", ("paper", "flat", "batched", "seq_step_ns"), "interval", " ns")
figure("ref.flat.warm-interval", ("paper", "flat", "batched", "seq_step_alone_warm_ns"), "interval", " ns")
figure("ref.flat.cold-interval", ("paper", "flat", "batched", "seq_step_alone_cold_ns"), "interval", " ns")


def _slice_us(root: Path) -> str:
    """How long a slice of batched flat's replay of paper takes in the reference run."""
    from harness.base.interleave import SLICES_PER_REP

    row = _row(root, ("paper", "flat", "batched", "seq_step_ns"))
    return f"{row['value'] * row['seqs'] * row['steps'] / SLICES_PER_REP / 1000:.0f} us"


_add("ref.flat.slice", f"{REFERENCE}/results.csv: paper/flat/batched/seq_step_ns, its seqs and steps", _slice_us)


SCALE = "results/scale"


def _scale_range(scenarios: tuple[str, ...], impls: tuple[str, ...], metric: str, unit: str) -> Callable[[Path], str]:
    """The smallest and largest ``metric`` of ``impls`` (batched) over ``scenarios`` in the committed scale run."""
    def render(root: Path) -> str:
        df = _run(root, SCALE).df
        rows = df[df.scenario.isin(scenarios) & df.impl.isin(impls) & (df.regime == "batched") & (df.metric == metric)
                  & (df.status == "ok")]
        if rows.empty:
            raise FactError(f"{SCALE}/results.csv: no {metric} of {impls} on {scenarios}")
        low, high = _fmt(rows.value.min()), _fmt(rows.value.max())
        return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"

    return render


_MILLION, _BELOW = ("context-1048576",), ("context-4096", "context-16384", "context-65536", "context-262144")
for _name, _scenarios, _impls, _metric, _unit in (
        ("scale.1m.cheapest", _MILLION, ("flat", "flat-rows", "cpp-flat", "cpp-flat-rows", "cpp-list"), "seq_step_ns",
         " ns"),
        ("scale.1m.list-jit", _MILLION, ("list-jit",), "seq_step_ns", ""),
        ("scale.1m.maps-and-lists", _MILLION, ("dict", "list", "dict-jit", "cpp-dict"), "seq_step_ns", ""),
        ("scale.flat-rows.below-1m", _BELOW, ("flat-rows",), "seq_step_ns_vs_flat", "×")):
    _add(_name, f"{SCALE}/results.csv: {_metric} of {', '.join(_impls)} on {', '.join(_scenarios)}",
         _scale_range(_scenarios, _impls, _metric, _unit))
figure("scale.flat-rows.1m", ("context-1048576", "flat-rows", "batched", "seq_step_ns_vs_flat"), "ratio", folder=SCALE)
for _scenario in ("chat-multiturn", "mooncake-cached"):
    _add(f"ref.hit.{_scenario}", f"{REFERENCE}/results.csv: {_scenario}/flat-pc/batched/cache_hit_tokens_pct",
         lambda root, s=_scenario: f"{_row(root, (s, 'flat-pc', 'batched', 'cache_hit_tokens_pct'))['value']:.0f} %")


def _paced_verdict(root: Path) -> str:
    from harness.output.formatting import target_word
    from harness.output.paced_report import TARGET_ABOVE_FLOOR

    word = target_word(_row(root, ("paper", "flat", "batched", "paced_above_floor_pct")), TARGET_ABOVE_FLOOR)
    return "not decided" if word == "no interval" else word


def _calibration_range(root: Path) -> str:
    """The smallest and largest ours/real of the modelled contenders, whole steps and engine calls alone."""
    import pandas as pd

    frame = pd.read_csv(root / "results/calibration/calibration.csv")
    frame = frame[frame["modelled"].astype(str).str.lower().isin(["true", "1"])]
    values = pd.concat([frame["ratio"], frame["ratio_calls"]]).dropna()
    return f"{values.min():.2f} to {values.max():.2f}"


_add("ref.paced.verdict", f"{REFERENCE}/results.csv: paced_above_floor_pct against "
     "harness.output.paced_report.TARGET_ABOVE_FLOOR", _paced_verdict)
_add("calibration.range", "results/calibration/calibration.csv: ratio, ratio_calls", _calibration_range)


def _account(variant: str) -> Callable[[Path], str]:
    def render(root: Path) -> str:
        import pandas as pd

        frame = pd.read_csv(root / "results/decode_account/decode_account.csv")
        values = frame.loc[frame["variant"] == variant, "flat_over"]
        return f"{values.min():.2f}-{values.max():.2f}×"

    return render


for _variant in ("no-save", "no-duplicate-check", "no-save-no-duplicate-check", "scratch-copy", "unchecked-flat",
                 "cpp-flat"):
    _add(f"account.{_variant}", f"results/decode_account/decode_account.csv: flat_over of {_variant}, every round",
         _account(_variant))


def _calibration_tvm(root: Path) -> str:
    """``cpp-flat`` over TVM's page bookkeeping on ``paper``, on the engine's calls, with its min-max."""
    import pandas as pd

    frame = pd.read_csv(root / "results/calibration/calibration.csv")
    row = frame[(frame["engine"] == "TVM") & (frame["contender"] == "cpp-flat") & (frame["scenario"] == "paper")]
    if row.empty:
        raise FactError("results/calibration/calibration.csv has no TVM row of cpp-flat on paper")
    r = row.iloc[0]
    return f"{r['ratio_calls']:.2g} [{r['ratio_calls_low']:.2g}-{r['ratio_calls_high']:.2g}]"


_add("calibration.tvm", "results/calibration/calibration.csv: ratio_calls of cpp-flat against TVM on paper",
     _calibration_tvm)
constant("calibration.band", "harness.calibration.table", "BAND", lambda v: f"{v[0]:g}-{v[1]:g}")
_add("ref.hit-rates", f"{REFERENCE}/results.csv: cache_hit_tokens_pct", _hit_rates)
_add("ref.cache-hit.vs-flat-pc", f"{REFERENCE}/results.csv: cache_hit_ns",
     lambda root: _over(root, "cache_hit_ns", ("radix-pc", "dict-pc"), "flat-pc"))
_add("ref.miss-evict.radix-vs-dict", f"{REFERENCE}/results.csv: cache_miss_evict_ns",
     lambda root: _over(root, "cache_miss_evict_ns", ("radix-pc",), "dict-pc"))


EXCERPTS = {"ci-example": "examples/ci/github-actions.yml", "ci-plugin-example": "examples/ci/plugin-repository.yml"}


def excerpt_section(name: str, root: Path = ROOT) -> str:
    """The lines of ``EXCERPTS[name]`` between ``# excerpt:begin`` and ``# excerpt:end``, dedented, fenced."""
    import textwrap

    path = EXCERPTS[name]
    text = (root / path).read_text(encoding="utf-8")
    found = re.findall(r"^[ \t]*# excerpt:begin[^\n]*\n(.*?)^[ \t]*# excerpt:end", text, re.S | re.M)
    if not found:
        raise FactError(f"{path}: no '# excerpt:begin' ... '# excerpt:end' lines")
    return "```yaml\n" + "".join(textwrap.dedent(part) for part in found) + "```"


def _sections(text: str, root: Path) -> str:
    from harness.output.readme import replace_section

    for name in EXCERPTS:
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin in text:
            text = replace_section(text, excerpt_section(name, root), begin, end)
    return text


# -- rendering --------------------------------------------------------------------------------------------------
def render(text: str, root: Path = ROOT) -> str:
    """``text`` with every fact's text rewritten from its source."""
    return FACT.sub(lambda m: f"<!-- fact:{m.group(1)} -->{lookup(m.group(1)).render(root)}<!-- /fact -->", text)


def stale(page: Path, root: Path = ROOT) -> list[str]:
    """``page:line: fact NAME reads 'X', SOURCE gives 'Y'`` for every fact of ``page`` its source contradicts."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FACT.finditer(text):
        fact = lookup(m.group(1))
        expected = fact.render(root)
        if m.group(2) != expected:
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{page.relative_to(root)}:{line}: fact {m.group(1)} reads {m.group(2)!r}, "
                       f"{fact.source} gives {expected!r}")
    return out


def main(argv: list[str]) -> int:
    """Rewrite every page's facts (``--check``: list the stale ones and exit 1 instead)."""
    root = ROOT
    problems = [p for page in sections.pages(root) for p in stale(page, root)]
    if "--check" in argv:
        print("\n".join(problems) or "every fact holds")
        return 1 if problems else 0
    for page in sections.pages(root):
        text = page.read_text(encoding="utf-8")
        if (new := _sections(render(text, root), root)) != text:
            from harness.base.files import atomic_write_text

            atomic_write_text(page, new)
    print(f"rewrote {len(problems)} stale fact{'s' * (len(problems) != 1)}" + "".join(f"\n  {p}" for p in problems))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except FactError as error:
        print(f"harness.facts: error: {error}", file=sys.stderr)
        sys.exit(2)
