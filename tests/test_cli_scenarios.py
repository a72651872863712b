"""The scenario and trace commands."""

from __future__ import annotations

from harness.cli import main
from scenarios import SCENARIOS, load


def test_scenarios_lists_every_scenario(capsys) -> None:
    assert main(["scenarios", "-v"]) == 0
    out = capsys.readouterr().out
    for name in SCENARIOS:
        assert name in out
    assert "--num-blocks 65536" in out


def test_trace_generate_and_show(tmp_path, capsys) -> None:
    path = tmp_path / "p.npz"
    assert main(["trace", "paper", "--steps", "12", "--running=32", "-o", str(path)]) == 0
    trace = load(path)
    assert trace.num_steps == 12 and trace.config["max_seqs"] == 32
    assert main(["trace", "--show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "copy-on-writes" in out and "peak blocks in use" in out


def test_trace_from_csv(tmp_path) -> None:
    csv = tmp_path / "mine.csv"
    rows = "".join(f"{i * 0.5},{30 + i},{4 + i % 3}\n" for i in range(40))
    csv.write_text("timestamp,prompt_tokens,output_tokens\n" + rows)
    out = tmp_path / "mine.npz"
    assert main(["trace", "--from-csv", str(csv), "--concurrency", "8", "-o", str(out)]) == 0
    trace = load(out)
    assert trace.header["num_requests"] == 40 and trace.header["scenario"] == "csv:mine.csv"


def test_errors_are_reported_not_raised(tmp_path, capsys) -> None:
    assert main(["trace", "paper", "--steps", "x", "-o", str(tmp_path / "a.npz")]) == 2
    assert "steps" in capsys.readouterr().err
    assert main(["trace", "--show", str(tmp_path / "none.npz")]) == 2
    assert main(["trace", "paper"]) == 2
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,prompt_tokens,output_tokens\n0,x,1\n")
    assert main(["trace", "--from-csv", str(bad), "-o", str(tmp_path / "b.npz")]) == 2
    assert "line 2" in capsys.readouterr().err
