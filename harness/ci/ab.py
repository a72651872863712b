"""``kvblock-bench ab BASE_REF [NEW_REF]``: the refs checked out into temporary worktrees, measured in one run
(:mod:`harness.run.ab`), compared with paired intervals, the gate's counts beside. Design: docs/ci.md#kvblock-bench-ab.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.args import DEFAULT_DEADLINE_S
from harness.base.files import atomic_write_text
from harness.ci import gate
from harness.ci.gate_config import load_config
from harness.errors import InputError
from harness.output.compare import (
    DEFAULT_METRICS,
    Comparison,
    Counted,
    Rules,
    compare_runs,
    load_run,
)
from harness.output.compare_report import RENDER
from harness.run.ab import Side, run_ab
from harness.run.runner import RunConfig

REPORTS = {"text": "compare.txt", "markdown": "compare.md", "json": "compare.json"}  # in NEW's run folder
# ab's defaults, which results/compare_pairs/ measures (docs/ci.md#kvblock-bench-ab).
AB_REPS = 8
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
    """NEW as this checkout's working tree: its commit, ``-dirty`` with the files that differ from it."""
    changed = git(repo, "diff", "--name-only", "HEAD").splitlines()
    commit = git(repo, "rev-parse", "--short=12", "HEAD") + ("-dirty" if changed else "")
    return Side("NEW", "", "working tree", commit, changed)


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
    tolerance = load_config(None).tolerance_pct
    comparison.counted_notes.append(f"a row's note names a change of instructions beyond {tolerance:g} % (the "
                                    "gate's tolerance: the two checkouts' paths alone move Python's counts a little)")
    by_cell = {(k.impl, k.regime): k for k in comparison.counted}
    for row in comparison.rows:
        words = by_cell[(row.impl, row.regime)].words(tolerance) if (row.impl, row.regime) in by_cell else ""
        row.notes += [words] if words else []


def run(opts: AbOptions, argv: list[str] | None = None) -> tuple[Comparison, Path]:
    """Check out, measure both versions in one run, compare and count; returns the comparison and NEW's run
    folder, where the reports are written (:data:`REPORTS`)."""
    try:
        repo = Path(git(Path.cwd(), "rev-parse", "--show-toplevel")).resolve()
    except InputError:
        raise InputError(f"{Path.cwd()}: not inside a git checkout; run `kvblock-bench ab` in the repository "
                         "whose refs it compares") from None
    with checkouts(repo, opts.base_ref, opts.new_ref) as sides:
        result = run_ab(opts.run, sides, argv)
        if set(result.folders) != {"BASE", "NEW"}:
            raise InputError("nothing was measured: neither side had a cell to run")
        base, new = (load_run(name, result.folders[name], opts.run.root) for name in ("BASE", "NEW"))
        comparison = compare_runs(base, new, opts.metrics, opts.threshold, rules=opts.rules, paired=result.paired)
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
