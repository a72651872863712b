"""scripts/decode_account.py: its edits still apply to `flat`'s decode step, a stale one stops it by name, and the
summary has a row per variant (no timing: the script's figures are in results/decode_account/)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import decode_account


def test_every_variant_is_flats_step_with_its_edits_applied() -> None:
    sources = decode_account.variant_sources()
    save, mark_check = "store(ints, slots + 2 * i, slot_out[_u(i)])", "if ints[_u(rec + MARK)] == stamp2:"
    assert save not in sources["no-save"] and sources["no-save"].count(mark_check) == 2
    assert sources["no-duplicate-check"].count(mark_check) == 1 and save in sources["no-duplicate-check"]
    assert save not in sources["no-save-no-duplicate-check"]
    assert sources["no-save-no-duplicate-check"].count(mark_check) == 1  # the full path keeps its check
    assert save not in sources["scratch-copy"] and "step_slots[_u(i)] = slot" in sources["scratch-copy"]
    classes = decode_account.variant_classes()
    assert list(classes) == ["flat", *decode_account.EDITS]
    assert all(cls.kernels.decode_step.py_func.__module__ == f"decode_account_{name.replace('-', '_')}"
               for name, cls in classes.items() if name != "flat")


def test_an_edit_that_no_longer_applies_stops_the_script_naming_the_variant() -> None:
    with pytest.raises(ValueError, match=r"variant no-save: .*redo the account's edits"):
        decode_account.edited("def decode_step():\n    pass\n", decode_account.EDITS["no-save"][0], "no-save")


def test_the_summary_has_a_row_per_variant_and_a_cell_per_condition_and_state() -> None:
    rows = pd.DataFrame([{"round": r, "condition": c, "state": s, "variant": v, "flat_over": 1.1, "ci_low": 1.05,
                          "ci_high": 1.2, "variant_ns": 3.0, "reps": 7}
                         for r in range(2) for c in ("idle", "loaded") for s in ("warm", "cold")
                         for v in ("no-save", "unchecked-flat", "cpp-flat")])
    text = decode_account.summary(rows, 2, "a machine", "abc1234")
    table = [line for line in text.splitlines() if line.startswith("| `")]
    assert [line.split(" | ")[0] for line in table] == ["| `no-save`", "| `unchecked-flat`", "| `cpp-flat`"]
    assert all(line.count("1.1 (1.1-1.1; 2 / 0 of 2)") == 4 for line in table)
    assert "at `abc1234` on a machine" in text
