"""``history``'s figure per engine: each metric against release, caching off and on, the slower steps marked.
Design: docs/output.md#harnesshistoryfigurepy."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from packaging.version import Version

from harness.history.anchored import groups_note
from harness.history.records import METRICS, UNITS, HistoryRow
from harness.history.verdicts import Step
from harness.output.drawing import MIN_FONT, new_figure, save_figure

STYLE = {"off": ("C0", "o", "caching off"), "on": ("C1", "s", "caching on")}

SLOWER = "slower than the release before (on its line)"


def _panel(ax, rows: list[HistoryRow], found: list[Step], releases: list[str]) -> None:
    """One scenario's metric: a series per caching mode, whiskers its 95 % interval, slower steps ringed in red."""
    for caching in sorted({r.caching for r in rows}, key=lambda c: c != "off"):
        colour, marker, label = STYLE.get(caching, ("C2", "^", f"caching {caching}"))
        mine = {r.version: r for r in rows if r.caching == caching and r.status == "ok" and math.isfinite(r.value)}
        xs = [i for i, v in enumerate(releases) if v in mine]
        ys = [mine[releases[i]].value for i in xs]
        lo = [max(0.0, y - mine[releases[i]].ci_low) if math.isfinite(mine[releases[i]].ci_low) else 0.0
              for i, y in zip(xs, ys, strict=True)]
        hi = [max(0.0, mine[releases[i]].ci_high - y) if math.isfinite(mine[releases[i]].ci_high) else 0.0
              for i, y in zip(xs, ys, strict=True)]
        ax.errorbar(xs, ys, yerr=[lo, hi], color=colour, marker=marker, ms=4, lw=1, capsize=2, label=label)
        slow = [releases.index(s.new) for s in found if s.caching == caching and s.verdict == "slower"
                and s.new in mine]
        ax.scatter(slow, [mine[releases[i]].value for i in slow], s=90, facecolors="none", edgecolors="red", lw=1.4,
                   zorder=5, label=SLOWER if slow and SLOWER not in ax.get_legend_handles_labels()[1] else None)
    ax.set_xticks(range(len(releases)), releases, rotation=60, fontsize=7)
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)


def _row_legend(row: list) -> None:
    """One legend on a row's first panel naming every series of the row (a scenario may have one caching mode)."""
    named: dict[str, object] = {}
    for ax in row:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            named.setdefault(label, handle)
    if named:
        row[0].legend(list(named.values()), list(named), fontsize=7, loc="lower left")


def draw(engine: str, rows: list[HistoryRow], found: list[Step], meta: dict, out: Path) -> list[Path]:
    """``history-ENGINE.png`` and ``.svg`` in ``out``: a panel per scenario and metric."""
    rows = [r for r in rows if r.engine == engine]
    releases = sorted({r.version for r in rows}, key=Version)
    scenarios = sorted({r.scenario for r in rows})
    width = max(4.2, 0.2 * len(releases))
    fig, axes = new_figure(width * len(METRICS), 3.2 * len(scenarios) + 1.1, len(scenarios), len(METRICS))
    for i, scenario in enumerate(scenarios):
        for j, metric in enumerate(METRICS):
            ax = axes[i * len(METRICS) + j]
            _panel(ax, [r for r in rows if r.scenario == scenario and r.metric == metric],
                   [s for s in found if s.engine == engine and s.scenario == scenario and s.metric == metric],
                   releases)
            ax.set_title(f"{scenario}: {metric}", fontsize=9)
            ax.set_ylabel(UNITS[metric], fontsize=8)
    for i in range(len(scenarios)):
        _row_legend(axes[i * len(METRICS): (i + 1) * len(METRICS)])
    reps = max((r.reps for r in rows), default=0)
    caption = (f"{engine}'s own block manager, each release imported unmodified from its published wheel, replayed "
               f"by the same driver, every release in a worker process of its own, in lockstep ({reps} repetitions "
               "each); whiskers: 95 % bootstrap intervals; red rings: compare's verdict 'slower' against the release "
               f"before. Machine: {meta.get('machine', '?')}; load average {meta.get('load_average', '?')} at the "
               f"start; commit {meta.get('git_commit', '?')}. {groups_note(meta)}").strip()
    fig.suptitle(f"{engine}: block-manager cost by release", fontsize=12)
    footer = textwrap.wrap(caption, width=int(fig.get_figwidth() * 14))
    fig.text(0.005, 0.004, "\n".join(footer), fontsize=MIN_FONT, ha="left", va="bottom", color="0.3")
    height = 0.14 * len(footer) + 0.08
    fig.get_layout_engine().set(rect=(0, height / fig.get_figheight(), 1, 1 - height / fig.get_figheight()))
    return save_figure(fig, out, f"history-{engine}")
