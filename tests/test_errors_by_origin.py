"""Errors by origin: bad input is one line (exit 2), a design's failure is its cells', a bug of ours a traceback."""

from __future__ import annotations

import pytest

from harness import cli
from harness.base.failures import REASON_CHARS, blamed_on, is_design_failure, short_reason
from harness.base.replay import ReplayError
from harness.errors import DesignFailure
from impls.designs.flat import FlatBlockManager


class _Raising(FlatBlockManager):
    def free(self, seq_id):
        raise RuntimeError("x" * 10_000)


def test_an_exception_raised_in_the_designs_code_is_the_designs() -> None:
    mgr = _Raising(64, 16, 4, 8)
    with pytest.raises(DesignFailure) as failure, blamed_on("raising", _Raising):
        mgr.free(0)
    assert failure.value.impl == "raising" and failure.value.reason.startswith("RuntimeError: xxx")
    assert len(failure.value.reason) <= REASON_CHARS and "\n" not in short_reason(ValueError("a\nb"))


def test_a_contract_error_raised_by_our_base_class_for_the_design_is_the_designs() -> None:
    with pytest.raises(DesignFailure, match="KeyError"), blamed_on("flat", FlatBlockManager):
        FlatBlockManager(64, 16, 4, 8).free(0)  # inactive: raised in impls.core.compiled, a base class


def test_a_trace_check_is_the_designs_and_an_exit_too() -> None:
    assert is_design_failure(ReplayError("wrong"), FlatBlockManager)

    class _Exiting(FlatBlockManager):
        def free(self, seq_id):
            raise SystemExit(0)

    with pytest.raises(DesignFailure, match="SystemExit"), blamed_on("exiting", _Exiting):
        _Exiting(64, 16, 4, 8).free(0)


def test_an_exception_of_ours_is_not_blamed_on_the_design() -> None:
    with pytest.raises(ValueError, match="ours"), blamed_on("flat", FlatBlockManager):
        raise ValueError("ours")


def test_a_bug_of_ours_ends_the_command_with_a_traceback_not_a_usage_error(monkeypatch, capsys) -> None:
    def buggy(args):
        raise ValueError("a bug in the harness")

    monkeypatch.setitem(cli.COMMANDS, "scenarios", buggy)
    with pytest.raises(ValueError, match="a bug in the harness"):
        cli.main(["scenarios"])  # not caught as bad input: the traceback shows, exit status 1
    assert cli.main(["run", "--reps", "0"]) == cli.EXIT_USAGE  # bad input stays one line, exit status 2
    assert "--reps" in capsys.readouterr().err
