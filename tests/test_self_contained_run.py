"""A run is self-contained: what its report compares against is copied into its folder when it runs, and the
report reads the run's folder alone (ARCHITECTURE.md: reports read only results.csv, meta.json, raw/ and
compared_with/), so an old run renders the same on any checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from harness.base import compared_with
from harness.base.project import CALIBRATION_CSV, PAPER_TABLE_CSV, ROOT
from harness.output.report import NOT_RECORDED, engines_section, report_texts
from harness.output.rundata import RunData
from harness.run.runner import RunConfig, RunWriter

REFERENCE = ROOT / "results" / "reference"
OWN_FILES = (".py", ".pyc", ".so", ".pth")

AUDIT = """
import json, os, sys
from pathlib import Path
run = Path(sys.argv[1])
from harness.output.report import report_texts
from harness.output.rundata import RunData
opened = []
sys.addaudithook(lambda event, args: opened.append(os.fsdecode(args[0]))
                 if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) else None)
report_texts(RunData.load(run))
print(json.dumps(opened))
"""


def reference_copy(tmp_path: Path) -> Path:
    """The committed reference run's files (no figures) in a folder of its own, outside the checkout."""
    run = tmp_path / "20990101-000000"
    shutil.copytree(REFERENCE, run, ignore=shutil.ignore_patterns("figures", "runs"))
    if not (run / compared_with.FOLDER).is_dir():  # a reference made before runs kept their comparisons
        compared_with.record(run)
    return run


def test_a_run_folder_keeps_what_its_report_compares_against(tmp_path) -> None:
    writer = RunWriter(RunConfig(root=tmp_path), {"commit": "x"})
    folder = writer.folder()
    kept = folder / compared_with.FOLDER
    assert (kept / compared_with.PAPER_TABLE).read_bytes() == PAPER_TABLE_CSV.read_bytes()
    assert (kept / compared_with.CALIBRATION).read_bytes() == CALIBRATION_CSV.read_bytes()


def test_the_report_reads_nothing_of_the_checkout_but_code(tmp_path) -> None:
    run = reference_copy(tmp_path)
    out = subprocess.run([sys.executable, "-c", AUDIT, str(run)], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    opened = {Path(p).resolve() for p in json.loads(out.stdout.strip().splitlines()[-1])}
    outside = sorted(str(p) for p in opened if p.is_relative_to(ROOT) and not p.is_relative_to(run.resolve())
                     and p.suffix not in OWN_FILES and ".venv" not in p.parts)
    assert not outside, f"the report of a run read files of the checkout: {outside}"


def test_the_report_renders_the_same_whatever_the_checkout_s_calibration(tmp_path, monkeypatch) -> None:
    run = reference_copy(tmp_path)
    before = report_texts(RunData.load(run))
    changed = tmp_path / "calibration.csv"
    changed.write_text(CALIBRATION_CSV.read_text().replace("paper", "elsewhere"))
    monkeypatch.setitem(compared_with.SOURCES, compared_with.CALIBRATION, changed)
    monkeypatch.setattr("harness.base.project.CALIBRATION_CSV", changed)
    assert report_texts(RunData.load(run)) == before


def test_a_run_that_kept_no_calibration_says_so(tmp_path) -> None:
    run = reference_copy(tmp_path)
    shutil.rmtree(run / compared_with.FOLDER, ignore_errors=True)
    section = engines_section(RunData.load(run))
    assert NOT_RECORDED in section and "calibrated: ours/real" not in section
