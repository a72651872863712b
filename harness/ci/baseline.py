"""Save a run as a committed baseline for ``kvblock-bench compare`` (``kvblock-bench baseline RUN FOLDER``).
Design: docs/output.md#harnesscibaselinepy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.errors import InputError
from harness.output.rundata import RunData

KEPT = ("results.csv", "meta.json", "paper_table.md", "summary.md")


def save_baseline(run: str | Path, dest: Path, root: Path) -> Path:
    """Copy the run ``run`` (a folder, or an id under ``root``) into baseline folder ``dest``; returns its folder."""
    if Path(run).is_file():
        raise InputError(f"{run}: a file; kvblock-bench baseline takes a run folder or run id (a pytest-benchmark "
                         "JSON file is no baseline any more: README, \"Benchmarks in CI\")")
    data = RunData.load(run, root)
    if data.meta.get("complete") is not True:
        raise InputError(f"{data.run_dir}: an incomplete run (interrupted, or without meta.json) cannot be a "
                         "baseline; run it again to the end")
    if dest.exists() and not (dest / "results.csv").is_file():
        raise InputError(f"{dest}: exists and is not a baseline folder; give a new folder or an old baseline")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _replace_folder(data.run_dir, dest)
    return data.run_dir


def _replace_folder(run_dir: Path, dest: Path) -> None:
    """``dest`` made anew from the run's :data:`KEPT` files beside it, then swapped in: old or new, never neither."""
    tmp, old = dest.parent / f".{dest.name}.new-{os.getpid()}", dest.parent / f".{dest.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for name in KEPT:
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, tmp / name)
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
    except BaseException:
        if old.exists() and not dest.exists():
            os.replace(old, dest)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if dest.exists():
            shutil.rmtree(old, ignore_errors=True)


def add_arguments(parser) -> None:
    """``kvblock-bench baseline``'s arguments."""
    parser.add_argument("run", help="the run to keep: a run folder, or a run id under --results")
    parser.add_argument("folder", type=Path, help="the baseline folder to write (e.g. results/baselines/bench-ci)")


def run(args) -> int:
    """Save the run as the baseline."""
    source = save_baseline(args.run, args.folder, Path(args.results))
    print(f"saved baseline {args.folder} from {source}")
    return 0
