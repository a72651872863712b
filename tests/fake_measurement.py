"""A stand-in for ``kvblock-bench gate``/``ab`` in the example workflows' fast tests: the arguments go through the
real parser (bad ones exit 2 as the real command does), then a canned result whose exit status is
``$FAKE_VERDICT`` (0 passed, 1 slower). ``python tests/fake_measurement.py [-m harness.cli] ARGS...``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cli import build_parser

VERDICTS = {"0": "✅ nothing slower beyond the threshold", "1": "❌ 1 slower beyond the threshold"}


def main(argv: list[str]) -> int:
    argv = argv[2:] if argv[:2] == ["-m", "harness.cli"] else argv
    args = build_parser().parse_args(argv)  # exits 2 with argparse's message on bad arguments
    verdict = __import__("os").environ.get("FAKE_VERDICT", "0")
    if args.command == "gate":  # what the real gate writes: each cell's rule, the verdict in a word
        if getattr(args, "json", None):
            Path(args.json).write_text(json.dumps({"config": "pyproject.toml [tool.kvblock-bench.gate]",
                                                   "rules": {"flat batched": "met", "mine batched": "no rule"},
                                                   "verdict": "passed", "failures": []}) + "\n")
        print("gate passed")
        return 0
    print(f"### kvblock-bench compare: {VERDICTS[verdict]}\n\n- stand-in for `kvblock-bench {' '.join(argv)}`")
    return int(verdict)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
