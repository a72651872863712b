"""scripts/paced_floor.py: flat's whole step hot and paced, through step(), straight to its kernel, and the
do-nothing crossing beside them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "paced_floor.py"
spec = importlib.util.spec_from_file_location("paced_floor", SCRIPT)
paced_floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paced_floor)


def test_every_kind_is_measured_and_written_with_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "floor.txt"
    assert paced_floor.main(["--scenario", "paper", "--steps", "30", "--reps", "1", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("# paper: batched flat, 30 steps at 2000 steps/s")
    assert [line.split()[2] for line in lines[1:4]] == ["step", "kernel", "noop"]
    assert [line.split()[1] for line in lines[4:]] == ["step", "kernel", "noop"]
    assert all(line.startswith("paced ") and "(1 repetitions)" in line for line in lines[4:])


def test_the_kernel_runner_does_the_same_work_as_step() -> None:
    """Straight to the kernel is the same work: the same tables and free blocks after the same steps."""
    from harness.base.drivers import Prepared
    from scenarios import generate

    prep = Prepared.from_trace(generate("paper", steps=40))
    managers = []
    for kind in ("step", "kernel"):
        mgr, run = paced_floor.runner(prep, kind)
        run(0, 40)
        managers.append(mgr)
    by_step, by_kernel = managers
    assert by_step.num_free_blocks() == by_kernel.num_free_blocks() < prep.trace.config["num_blocks"]
    live = [int(s) for s in prep.decode_ids[39][:8]]
    assert [list(by_step.block_table(s)) for s in live] == [list(by_kernel.block_table(s)) for s in live]
