"""Do the contract tests catch known bugs? Apply each mutation to a copy of the repository and run them.

Usage: python scripts/mutation_check.py [--only NAME ...] [--seed N] [--examples N]

Each mutation is a literal (file, old text, new text) edit of ``impls/``. It is applied, one at a time, in a
temporary copy of the repository (impls/ scenarios/ harness/ tests/ pyproject.toml; the real tree is only
read), and the contract checker's tests for the affected implementation run there. A mutation whose old
text is not exactly once in its file stops the script before anything runs (exit status 2): the sources
moved on and the mutation must be rewritten, not silently skipped.

Prints a table (mutation, caught, by which test, seconds). Exit status 0 only if every mutation is caught.
The copy compiles its Numba kernels afresh (a mutated source makes its own cache folder), which is most of
the time each row takes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("impls", "scenarios", "harness", "tests", "pyproject.toml")
CONFORMS = "tests/test_contract_stateful.py::test_implementation_conforms[{}]"


@dataclass(frozen=True)
class Mutation:
    """A known bug, as a literal edit, and the tests that must catch it."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation(
        "flat: decode step skips its slot write",
        "impls/designs/flat.py",
        "        slot_out[_u(i)] = (block << sh) | off\n    return cows, 0\n",
        "    return cows, 0\n",
        (CONFORMS.format("flat"),),
    ),
    Mutation(
        "list: free skips the decrement of shared blocks",
        "impls/designs/list_design.py",
        "            self._refs[block] -= 1\n            if self._refs[block] == 0:\n",
        "            if self._refs[block] == 1:\n                self._refs[block] = 0\n",
        (CONFORMS.format("list"),),
    ),
    Mutation(
        "flat: free skips the decrement of shared blocks",
        "impls/designs/flat.py",
        "        r = ints[_u(refs + block)] - 1\n",
        "        r = ints[_u(refs + block)] - (ints[_u(refs + block)] == 1)\n",
        (CONFORMS.format("flat"),),
    ),
    Mutation(
        "flat: allocate pops the bottom of the free stack",
        "impls/designs/flat.py",
        "        top -= 1\n        block = ints[_u(stack + top)]\n",
        # top counts down: the j-th block from the bottom
        "        top -= 1\n        block = ints[_u(stack + ints[TOP] - 1 - top)]\n",
        (CONFORMS.format("flat"),),
    ),
    Mutation(
        "compiled: decode step skips the duplicate check",
        "impls/core/validation.py",
        "        if marks[seq] == stamp:\n            return E_DUPLICATE, i\n",
        "        if False:\n            return E_DUPLICATE, i\n",
        (CONFORMS.format("list-jit"),),  # flat checks its batch in its own one pass (next mutation)
    ),
    Mutation(
        "flat: decode step skips the duplicate check",
        "impls/designs/flat.py",
        "        if mark == stamp2:",
        "        if False:",
        (CONFORMS.format("flat"),),
    ),
    Mutation(
        "flat: a rolled-back step leaves the shared bit clear",
        "impls/designs/flat.py",
        "        ints[_u(rec + MARK)] |= SHARED\n        j = _u(n >> sh)\n",
        "        j = _u(n >> sh)\n",
        ("tests/test_flat_differential.py",),
    ),
    Mutation(
        "interpreted: decode step skips the duplicate check",
        "impls/core/interpreted.py",
        "            if s in seen:\n                self._fail(E_DUPLICATE, s)\n",
        "",
        (CONFORMS.format("list"),),
    ),
)


def check_applicable(mutations: tuple[Mutation, ...]) -> list[str]:
    """Why each inapplicable mutation cannot be applied to the real tree (read only)."""
    problems = []
    for m in mutations:
        count = (ROOT / m.file).read_text().count(m.old)
        if count != 1:
            problems.append(f"{m.name}: {m.file} contains the old text {count} times (expected exactly once)")
    return problems


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", ".hypothesis")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def run_mutation(m: Mutation, seed: int, examples: int) -> tuple[bool, str, float]:
    """(caught, by which test(s), seconds) for one mutation, in a fresh copy of the repository."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvb-mutant-") as tmp:
        work = Path(tmp)
        copy_tree(work)
        target = work / m.file
        target.write_text(target.read_text().replace(m.old, m.new))
        env = {**os.environ, "PYTHONPATH": str(work), "KVB_HYPOTHESIS_SEED": str(seed),
               "KVB_HYPOTHESIS_EXAMPLES": str(examples)}
        env.pop("NUMBA_CACHE_DIR", None)  # the copy's own cache folder, keyed by its (mutated) sources
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *m.tests],
                              cwd=work, env=env, capture_output=True, text=True, timeout=1800, check=False)
    seconds = time.perf_counter() - started
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.MULTILINE)
    if proc.returncode == 1 and failed:
        return True, ", ".join(f.split("::", 1)[-1] for f in failed), seconds
    if proc.returncode == 0:
        return False, "-", seconds
    # Collection errors, crashes, timeouts: not a clean catch by a test; show why.
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return False, f"pytest exit {proc.returncode}: {' | '.join(tail)}", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="run only mutations whose name contains one of these")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed for the checker (default 0)")
    parser.add_argument("--examples", type=int, default=50, help="examples per checker run (default 50)")
    args = parser.parse_args(argv)
    mutations = tuple(m for m in MUTATIONS if not args.only or any(o in m.name for o in args.only))
    problems = check_applicable(mutations)
    if problems:
        print("mutations no longer apply; rewrite them:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    rows = []
    print(f"{'mutation':<52} {'caught':<6} {'seconds':>7}  by", flush=True)
    for m in mutations:
        caught, by, seconds = run_mutation(m, args.seed, args.examples)
        rows.append(caught)
        print(f"{m.name:<52} {'yes' if caught else 'NO':<6} {seconds:>7.1f}  {by}", flush=True)
    print(f"killed {sum(rows)} of {len(rows)} mutations")
    return 0 if all(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
