"""A run pins torch's intra-op pool to one thread, and gives the previous count back."""

from __future__ import annotations

import sys

import pytest

from harness.base.threads import one_intra_op_thread


def test_torch_runs_one_intra_op_thread_within_a_run() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (EXTRAS=test)")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_intra_op_thread() as threads:
            assert threads == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_without_torch_loaded_nothing_is_imported(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with one_intra_op_thread() as threads:
        assert threads is None
    assert "torch" not in sys.modules


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_a_run_holds_torch_to_one_thread_in_its_workers(tmp_path) -> None:
    """torch arrives in a worker with the design that needs it, after the job starts: it is pinned then too."""
    import json

    from harness.cli import main
    from impls import REGISTRY

    if "sglang" not in REGISTRY:
        pytest.skip("sglang needs torch")
    assert main(["run", "--results", str(tmp_path), "--quick", "--no-progress", "--scenario", "paper", "--impl",
                 "sglang", "--regime", "batched", "--no-paced", "--no-l1d", "--no-table-copy",
                 "--no-allocations"]) == 0
    meta = json.loads((tmp_path / "latest" / "meta.json").read_text())
    assert meta["torch_intra_op_threads"] == 1
