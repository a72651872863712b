"""Every flag that names a file or a class, given one that is missing, a folder, binary, empty or not a class: one
line naming the flag or the file, exit status 2, no traceback, nothing written (issue 57, item 4)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cli import main
from harness.errors import InputError
from tests.test_compare import make_run, three
from tests.test_nothing_invented import history_folder

BAD_FILES = {"missing": None, "folder": "dir", "binary": b"\x00\xff\xfe garbage", "empty": b""}


def bad_file(tmp: Path, kind: str) -> str:
    path = tmp / f"bad-{kind}"
    content = BAD_FILES[kind]
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return str(path)


def cases(tmp: Path, kind: str, run: str, bad: str) -> dict[str, list[str]]:
    """The commands, each naming ``bad`` (a file of ``kind``) with one flag."""
    out = {
        "trace --show": ["trace", "--show", bad],
        "trace --from-csv": ["trace", "--from-csv", bad, "-o", str(tmp / "t.npz")],
        "run --trace": ["run", "--trace", bad, "--impl", "flat", "--quick", "--no-progress", "--results",
                        str(tmp / "r")],
        "report --readme": ["report", run, "--no-figures", "--readme", bad],
        "report --growth-readme": ["report", run, "--no-figures", "--growth-readme", bad],
        "report --history-readme": ["report", str(history_folder(tmp)), "--history-readme", bad],
        "compare BASE": ["compare", bad, run],
        "compare NEW": ["compare", run, bad],
        "baseline RUN": ["baseline", bad, str(tmp / "b")],
        "gate --config": ["gate", "--config", bad, "--no-callgrind"],
        "gate --against": ["gate", "--against", bad, "--no-callgrind"],
        "gate --trace": ["gate", "--trace", bad, "--no-callgrind", "--impl", "flat"],
        "calibrate --source": ["calibrate", "nano-vllm", "--source", bad, "--out", str(tmp / "c.csv")],
        "calibrate --find-links": ["calibrate", "vllm==0.20.0", "--find-links", bad, "--out", str(tmp / "c.csv")],
        "history --find-links": ["history", "vllm", "0.20.0,0.21.0", "--find-links", bad],
    }
    if kind == "folder":
        out |= {"trace -o": ["trace", "paper", "-o", bad], "calibrate --out": ["calibrate", "nano-vllm", "--source",
                                                                               str(tmp), "--out", bad]}
    if kind in ("binary", "empty"):
        out |= {"history --out": ["history", "vllm", "0.1.0", "--out", bad],
                "gate --json": ["gate", "--json", str(Path(bad) / "x.json"), "--no-callgrind", "--impl", "flat"]}
    return out


NAMES = ["trace --show", "trace --from-csv", "run --trace", "report --readme", "report --growth-readme",
         "report --history-readme", "compare BASE", "compare NEW", "baseline RUN", "gate --config", "gate --against",
         "gate --trace", "calibrate --source", "calibrate --find-links", "history --find-links"]
ALL = [(kind, name) for kind in BAD_FILES
       for name in NAMES + {"folder": ["trace -o", "calibrate --out"], "binary": ["history --out", "gate --json"],
                            "empty": ["history --out", "gate --json"]}.get(kind, [])]


@pytest.mark.parametrize(("kind", "flag"), ALL, ids=[f"{f} {k}" for k, f in ALL])
def test_a_bad_file_is_one_line_naming_it(kind: str, flag: str, tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path / "run", three())
    argv = cases(tmp_path, kind, str(run), bad_file(tmp_path, kind))[flag]
    before = sorted(p.name for p in run.iterdir())
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, (status, out[-1500:], err[-1500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvblock-bench: error: ") and "Traceback" not in out + err, err
    assert "bad-" in lines[0] or flag.split()[-1] in lines[0], lines[0]
    assert sorted(p.name for p in run.iterdir()) == before  # no report written beside a refusal


# -- flags that name a class ----------------------------------------------------------------------------------
MODULE = """\
def function(*args):
    return None
NUMBER = 3
class Fine:
    pass
INSTANCE = Fine()
"""
NOT_CLASSES = {"function": "function", "NUMBER": "NUMBER", "INSTANCE": "INSTANCE", "Missing": "Missing"}


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if c != "check" else c
                                     for c in ("check", "run", "gate")])
@pytest.mark.parametrize("name", NOT_CLASSES)
def test_a_plugin_that_is_not_a_class_is_one_line(command: str, name: str, tmp_path: Path, monkeypatch,
                                                  capsys) -> None:
    module = f"notaclass_{command}_{name.lower()}"
    (tmp_path / f"{module}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers inherit it
    spec = f"{module}:{name}"
    argv = {"check": ["check", spec, "--seeds", "1", "--examples", "2"],
            "run": ["run", "--impl", f"flat,{spec}", "--scenario", "paper", "--quick", "--no-progress", "--results",
                    str(tmp_path / "r")],
            "gate": ["gate", "--impl", spec, "--no-callgrind"]}[command]
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, (status, out[-1500:], err[-1500:])
    (line,) = err.strip().splitlines()
    assert line.startswith("kvblock-bench: error: ") and spec in line and "Traceback" not in out + err, line
    assert not (tmp_path / "r").exists()


def test_an_engine_whose_class_is_not_a_class_is_refused_naming_it() -> None:
    """calibrate --source (and history): the engine's names the adapter drives as classes must be classes."""
    from harness.calibration.replays import _classes_checked
    from harness.engines.catalog import ENGINES

    engine = ENGINES["nano-vllm"]
    fine = SimpleNamespace(BlockManager=type("BlockManager", (), {}), helper=len)
    assert _classes_checked(engine, None, fine) is fine
    for value in (len, 3, object(), "BlockManager"):
        with pytest.raises(InputError, match=r"BlockManager in its modules is not a class \(it is of type"):
            _classes_checked(engine, "0.1", SimpleNamespace(BlockManager=value))


@pytest.mark.slow  # replays in a worker process (about 10 s)
@pytest.mark.parametrize("swap", ["BlockManager = 42", "def BlockManager(*args):\n    return None",
                                  "Sequence = 'not a class'"])
def test_calibrate_source_whose_engine_class_is_not_a_class_is_one_line(swap: str, tmp_path: Path, capsys) -> None:
    from tests.calibration_standin import write_standin

    source = write_standin(tmp_path / "nano")
    module = "sequence" if swap.startswith("Sequence") else "block_manager"
    path = source / "nanovllm" / "engine" / f"{module}.py"
    path.write_text(path.read_text() + "\n" + textwrap.dedent(swap) + "\n")
    status = main(["calibrate", "nano-vllm", "--source", str(source), "--scenario", "paper", "--reps", "1", "--out",
                   str(tmp_path / "c.csv"), "--steps", "24", "--running", "12", "--num-blocks", "2048"])
    out, err = capsys.readouterr()
    assert status == 2 and "Traceback" not in out + err, (status, err[-2000:])
    assert err.strip().splitlines()[-1].startswith("kvblock-bench: error: nano-vllm") and "not a class" in err
    assert not (tmp_path / "c.csv").exists()
