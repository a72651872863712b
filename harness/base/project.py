"""The project's own files, found from the one place that knows where the checkout is (``coderoot.HARNESS_ROOT``)."""

from __future__ import annotations

from harness.base.coderoot import HARNESS_ROOT

ROOT = HARNESS_ROOT
IMPLS_DIR = ROOT / "impls"
SCENARIO_DATA = ROOT / "scenarios" / "data"
PAPER_TABLE_CSV = ROOT / "harness" / "data" / "paper_table.csv"
CALIBRATION_CSV = ROOT / "results" / "calibration" / "calibration.csv"
TIMES_JSON = ROOT / "results" / "times" / "times.json"
