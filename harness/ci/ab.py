"""``kvblock-bench ab BASE_REF [NEW_REF]``: the refs checked out into temporary worktrees, measured in one run
(:mod:`harness.run.versions`), compared, the gate's counts beside. Design: docs/ci.md#kvblock-bench-ab.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as importlib_metadata
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.base import coderoot
from harness.base.args import DEFAULT_DEADLINE_S
from harness.base.files import atomic_write_text
from harness.base.metrics import TIMED_FIGURES
from harness.errors import InputError, TooFewPairs
from harness.gate import command as gate
from harness.gate.config import DEFAULT_COUNTS_THRESHOLD_PCT, load_config
from harness.output.compare import (
    DEFAULT_METRICS,
    MIN_PAIRS,
    Comparison,
    Counted,
    Rules,
    compare_runs,
    load_run,
)
from harness.output.compare_report import RENDER
from harness.run import metadata
from harness.run.runner import RunConfig, processes_of
from harness.run.versions import Side, from_ref, run_ab

REPORTS = {"text": "compare.txt", "markdown": "compare.md", "json": "compare.json"}  # in NEW's run folder
# ab's defaults, which results/compare_pairs/ measures (docs/ci.md#kvblock-bench-ab).
AB_REPS = 8
AB_QUICK_REPS = MIN_PAIRS
AB_THRESHOLD_PCT = 5.0


@dataclass
class AbOptions:
    """What ``kvblock-bench ab`` was asked: the refs, the run, the comparison, the counts."""

    base_ref: str
    new_ref: str | None = None
    run: RunConfig = field(default_factory=RunConfig)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    threshold: float = AB_THRESHOLD_PCT / 100
    rules: Rules = field(default_factory=Rules)
    counts: bool = True
    deadline_s: float = DEFAULT_DEADLINE_S
    counts_threshold_pct: float | None = None  # None: the configuration's


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS``'s output; :class:`InputError` with git's message when it fails."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InputError(f"git {' '.join(args)}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    return proc.stdout.strip()


def commit_of(repo: Path, ref: str, flag: str) -> str:
    """The commit ``ref`` names in ``repo``; :class:`InputError` naming ``flag`` when it names none."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except InputError:
        raise InputError(f"{flag} {ref}: not a commit of {repo}; give a branch, tag or commit (e.g. origin/main)"
                         ) from None


def working_tree(repo: Path) -> Side:
    """NEW as the repository's working tree: its commit, ``-dirty`` with the files that differ from it."""
    changed = git(repo, "diff", "--name-only", "HEAD").splitlines()
    commit = git(repo, "rev-parse", "--short=12", "HEAD") + ("-dirty" if changed else "")
    return Side("NEW", str(repo), "working tree", commit, changed)


def repository_here() -> Path:
    """The git checkout of the current folder: the repository whose refs ``ab`` compares."""
    try:
        return Path(git(Path.cwd(), "rev-parse", "--show-toplevel")).resolve()
    except InputError:
        raise InputError(f"{Path.cwd()}: not inside a git checkout; run `kvblock-bench ab` in the repository "
                         "whose refs it compares") from None


def results_root(repo: Path) -> Path:
    """``ab``'s runs by default: ``results/`` in a checkout of kvblock-bench, else a cache folder outside it."""
    if coderoot.is_checkout(repo):
        return repo / "results"
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    return base / "kvblock-bench" / "ab" / repo.name


def check_code(repo: Path) -> bool:
    """Refuse a repository whose versions' code would come from elsewhere; whether it is a kvblock-bench checkout."""
    own = coderoot.is_checkout(repo)
    if own and repo != coderoot.HARNESS_ROOT:
        raise InputError(f"this kvblock-bench runs from {coderoot.HARNESS_ROOT}, not from {repo}, the checkout whose "
                         "refs ab compares: NEW would be measured with another checkout's harness; run the "
                         f"checkout's own (`{repo}/.venv/bin/kvblock-bench ab ...`, or `python -m harness.cli ab ...` "
                         "there) with no PYTHONPATH naming another checkout")
    for name, where in coderoot.shadowed(repo):
        raise InputError(f"module {name}: this Python imports it from {where}, not from {repo}, whose refs ab "
                         "compares (a PYTHONPATH entry or another checkout): ab would measure that copy; remove it "
                         "from PYTHONPATH")
    return own


def harness_words() -> str:
    """The installed harness: its version, folder and commit."""
    try:
        version = f" {importlib_metadata.version('kvblock-bench')}"
    except importlib_metadata.PackageNotFoundError:
        version = ""
    commit = metadata.git_commit()
    where = "" if commit == "not a git checkout" else f", commit {commit}"
    return f"the installed kvblock-bench{version} ({coderoot.HARNESS_ROOT}{where})"


def origin_words(side: Side, own: bool) -> str:
    """Where ``side``'s code came from, for the headline: its folder and commit, and what is the harness's."""
    where = (f"{side.code} (the working tree at {side.commit})" if side.ref == "working tree"
             else f"{side.code} (a temporary worktree of {side.ref}, commit {side.commit})")
    if own:
        return f"{side.name}: designs and harness from {where}"
    mine = [name for name, info in side.infos.items() if from_ref(side, info)]
    others = [name for name in side.infos if name not in mine]
    return (f"{side.name}: {', '.join(mine) or 'no implementation'} from {where}; the harness"
            f"{' and ' + ', '.join(others) if others else ''} from {harness_words()}")


@contextlib.contextmanager
def checkouts(repo: Path, base_ref: str, new_ref: str | None) -> Iterator[list[Side]]:
    """BASE (and NEW when a ref is given) checked out into temporary worktrees, removed (and pruned) on exit."""
    refs = [("BASE", base_ref, "BASE_REF"), *([("NEW", new_ref, "NEW_REF")] if new_ref else [])]
    commits = [commit_of(repo, ref, flag) for _, ref, flag in refs]
    try:
        with tempfile.TemporaryDirectory(prefix="kvblock-bench-ab-") as tmp, _worktrees(repo) as made:
            sides = []
            for (name, ref, _), commit in zip(refs, commits, strict=True):
                path = Path(tmp) / name.lower()
                made.append(path)
                git(repo, "worktree", "add", "--quiet", "--detach", str(path), commit)
                sides.append(Side(name, str(path), ref, commit[:12]))
            yield sides if new_ref else [*sides, working_tree(repo)]
    finally:
        with contextlib.suppress(InputError):
            git(repo, "worktree", "prune")


@contextlib.contextmanager
def _worktrees(repo: Path) -> Iterator[list[Path]]:
    """The worktrees added within the block, each removed on exit."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            with contextlib.suppress(InputError):
                git(repo, "worktree", "remove", "--force", str(path))


def counted_cells(sides: list[Side], impls: list[str]) -> list[tuple[str, str]]:
    """The gate's cells of the implementations both sides measured (``impls``, else the gate's own)."""
    names = impls or gate.gate_impls(None, load_config(None), False)
    both = [n for n in names if all(n in side.infos for side in sides)]
    return [cell for cell in gate.gate_cells(both) if cell[0] in both]


def add_counts(comparison: Comparison, sides: list[Side], opts: AbOptions) -> None:
    """The gate's counts of both versions beside the timings: a table, and a note on every row whose work changed."""
    cells = counted_cells(sides, opts.run.impls)
    figures = []
    for side in sides:
        print(f"== the gate's counts of {side.name} ({side.ref})", file=sys.stderr, flush=True)
        with contextlib.redirect_stdout(sys.stderr):  # the gate's progress lines: the report alone goes to stdout
            found, problems = gate.count_cells(gate.TRACE, cells, side.code, opts.deadline_s)
        figures.append(found)
        comparison.counted_notes += [f"{side.name}: {p}" for p in problems]
    with contextlib.redirect_stdout(sys.stderr):
        comparison.counted_notes.append(f"callgrind's environment: the run's, except {gate.environment_note()}")
    for cell in cells:
        comparison.counted.append(Counted(*cell, tuple(f[cell].instructions_per_seq_step for f in figures),
                                          tuple(f[cell].memray_per_step for f in figures)))
    config = load_config(None)
    threshold = config.counts_threshold_pct if opts.counts_threshold_pct is None else opts.counts_threshold_pct
    comparison.counts_threshold_pct = threshold
    where = "--counts-threshold" if opts.counts_threshold_pct is not None else (
        f"counts_threshold_pct of [tool.kvblock-bench.gate], default {DEFAULT_COUNTS_THRESHOLD_PCT:g}")
    comparison.counted_notes.append(f"NEW's instructions per sequence-step or allocations per step above BASE's by "
                                    f"more than {threshold:g} % ({where}) fail; a row's note names a change beyond it")
    by_cell = {(k.impl, k.regime): k for k in comparison.counted}
    for row in comparison.rows:
        words = by_cell[(row.impl, row.regime)].words(threshold) if (row.impl, row.regime) in by_cell else ""
        row.notes += [words] if words else []


def check_options(cfg: RunConfig, metrics: tuple[str, ...]) -> None:
    """Refuse metrics ``ab`` does not pair, and fewer than :data:`MIN_PAIRS` pairs of processes (TooFewPairs)."""
    unknown = [m for m in metrics if m not in TIMED_FIGURES]
    if unknown:
        raise InputError(f"--metric {','.join(unknown)}: ab compares the figures it pairs over repetitions: "
                         f"{', '.join(TIMED_FIGURES)}")
    pairs = min(processes_of(cfg), cfg.reps)
    if pairs >= MIN_PAIRS:
        return
    given = f"--processes {cfg.processes}" if cfg.processes and cfg.processes < cfg.reps else f"--reps {cfg.reps}"
    raise TooFewPairs(f"too few pairs for a verdict: use at least {MIN_PAIRS} ({given} gives {pairs} pair"
                      f"{'s' * (pairs != 1)} of worker processes per implementation, too few for an interval to "
                      f"cover what varies between processes; give --reps {MIN_PAIRS} or more"
                      f"{' and as many --processes' if cfg.processes else ''})")


def run(opts: AbOptions, argv: list[str] | None = None) -> tuple[Comparison, Path]:
    """Check out, measure both versions in one run, compare and count; returns the comparison and NEW's run
    folder, where the reports are written (:data:`REPORTS`)."""
    check_options(opts.run, opts.metrics)
    repo = repository_here()
    own = check_code(repo)
    with checkouts(repo, opts.base_ref, opts.new_ref) as sides:
        result = run_ab(opts.run, sides, argv, lambda side: origin_words(side, own))
        if set(result.folders) != {"BASE", "NEW"}:
            raise InputError("nothing was measured: neither side had a cell to run")
        base, new = (load_run(name, result.folders[name], opts.run.root) for name in ("BASE", "NEW"))
        comparison = compare_runs(base, new, opts.metrics, opts.threshold, rules=opts.rules, paired=result.paired,
                                  pairs={key: len(ratios) for key, ratios in result.pairs.items()})
        try:
            if opts.counts:
                add_counts(comparison, sides, opts)
        except KeyboardInterrupt:
            comparison.counted.clear()
            comparison.counted_notes.append("the gate's counts were interrupted: none is shown")
            write_reports(comparison, result.folders["NEW"])
            raise
    write_reports(comparison, result.folders["NEW"])
    return comparison, result.folders["NEW"]


def write_reports(comparison: Comparison, folder: Path) -> None:
    for fmt, name in REPORTS.items():
        atomic_write_text(folder / name, RENDER[fmt](comparison))
