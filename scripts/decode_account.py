"""Where the time `flat`'s checks add to its decode step goes: whole replays of `paper`, paired slice against slice.

Usage: python scripts/decode_account.py [--rounds 3] [--reps 7] [--neighbour-procs 2] [--out results/decode_account]

In one process, batched `flat` and timing variants of its decode step replay `paper` in turn on each slice (the
pairing of `harness.studies.limit_loop.paired`), warm and cold, each round once idle and once beside
`scripts/noisy_neighbour.py` (the order alternating). The variants are `flat`'s own `decode_step` source with one
edit each (`EDITS`; an edit that no longer applies stops the script: `flat` changed and the account must be redone):
probes of what one part of the step costs, not designs. Beside them, the yardsticks `unchecked-flat` and `cpp-flat`.
Writes `OUT/decode_account.csv` (a row per round, condition, state and variant) and `OUT/README.md`, atomically.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from compare_pairs import neighbour  # noqa: E402

from harness.base.files import atomic_write_text  # noqa: E402
from harness.base.host import cpu_identity, machine_name  # noqa: E402
from harness.output.markdown import markdown_table  # noqa: E402

_SAVE = "store(ints, slots + 2 * i, slot_out[_u(i)])"
_COMMON_SAVE = f"            {_SAVE}  # a failed step leaves the caller's buffers as they were\n"
_SLOW_SAVE = f"        {_SAVE}\n"
_MARK_CHECK = ("            if ints[_u(rec + MARK)] == stamp2:  # appended earlier in this step (which leaves exactly "
               "stamp2)\n                break\n")
_MARK_STORE = "            ints[_u(rec + MARK)] = stamp2\n"
_NO_SAVE = ((_COMMON_SAVE, ""), (_SLOW_SAVE, ""))
_NO_MARK = ((_MARK_CHECK, ""), (_MARK_STORE, ""))
_SCRATCH = (
    ("    cows, i = 0, 0\n", "    cows, i = 0, 0\n    step_slots = ints[_u(slots) : _u(slots + 2 * min(n, "
     "table.shape[0]))].view(np.int64)\n"),
    (_COMMON_SAVE + "            slot_out[_u(i)] = slot\n", "            step_slots[_u(i)] = slot\n"),
    ("        if i == n:\n            return cows, 0\n",
     "        if i == n:\n            for k in range(n):\n                slot_out[_u(k)] = step_slots[_u(k)]\n"
     "            return cows, 0\n"),
    (_SLOW_SAVE + "        slot_out[_u(i)] = slot\n", "        step_slots[_u(i)] = slot\n"))
# name: (edits, what it leaves out or changes, whether the contract still holds)
EDITS = {
    "no-save": (_NO_SAVE, "without saving each `slot_out` entry before overwriting it", "no: a failed step leaves "
                "`slot_out` changed"),
    "no-duplicate-check": (_NO_MARK, "without the common path's duplicate check (the mark's read, compare, write)",
                           "no: an id listed twice is appended twice"),
    "no-save-no-duplicate-check": (_NO_SAVE + _NO_MARK, "without both", "no"),
    "scratch-copy": (_SCRATCH, "slots to an int64 scratch in `ints`, copied to `slot_out` once the step succeeds "
                     "(`cpp-flat`'s way)", "yes, once `_fail` no longer restores `slot_out` (replays here never fail)"),
}
YARDSTICKS = {"unchecked-flat": "`flat`'s loop with none of the contract's checks (the `limit_loop` yardstick)",
              "cpp-flat": "the C++ twin (same algorithm, same checks)"}


def edited(source: str, edits: tuple[tuple[str, str], ...], name: str) -> str:
    """``source`` with each ``(old, new)`` applied once; ValueError naming the variant when one does not apply."""
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"variant {name}: impls/designs/flat.py's decode_step changed, its edit no longer "
                             f"applies ({old.strip()[:60]!r}): redo the account's edits")
        source = source.replace(old, new)
    return source


def variant_sources() -> dict[str, str]:
    """Each variant's decode step: ``flat``'s own source with the variant's edits."""
    import inspect

    from impls.designs import flat

    source = inspect.getsource(flat.decode_step.py_func).replace("@kernel\n", "")
    return {name: edited(source, edits, name) for name, (edits, _, _) in EDITS.items()}


def variant_classes() -> dict[str, type]:
    """``flat``, then a FlatBlockManager per variant whose decode step is compiled from :func:`variant_sources`."""
    from numba import njit

    from impls.core.compiled import Kernels
    from impls.designs import flat

    classes = {"flat": flat.FlatBlockManager}
    for name, source in variant_sources().items():
        namespace = dict(vars(flat), __name__=f"decode_account_{name.replace('-', '_')}")
        exec(source, namespace)  # flat's own source, edited by EDITS
        step = njit(_nrt=False)(namespace["decode_step"])
        classes[name] = type(name, (flat.FlatBlockManager,), {"kernels": Kernels(*flat.KERNELS[:5], step,
                                                                                  *flat.KERNELS[6:])})
    return classes


def contenders() -> dict[str, type]:
    """``flat`` first, then the variants and the yardsticks (``cpp-flat`` where the C++ library was built)."""
    from harness.studies.unchecked_flat import UncheckedFlatManager
    from impls import registry

    classes = {**variant_classes(), "unchecked-flat": UncheckedFlatManager}
    try:
        classes["cpp-flat"] = registry.record("cpp-flat").load()
    except ImportError as exc:
        print(f"cpp-flat left out: {exc}", flush=True)
    return classes


def drivers(classes: dict[str, type]) -> list:
    """A driver per class over one ``paper`` trace, ``flat``'s first (built once: every pass replays the same)."""
    from harness.base.drivers import Prepared
    from harness.base.interleave import Driver
    from scenarios import PAPER, generate

    prep, loops = Prepared.from_trace(generate(PAPER)), {}
    return [Driver(prep, cls, "batched", loops, name) for name, cls in classes.items()]


def measure(replays: list, evictor, reps: int) -> list[dict]:
    """One pass: every variant and yardstick paired with ``flat``, warm and cold; a row per state and variant."""
    from harness.base.stats import median_estimate
    from harness.studies.limit_loop import paired

    rows = []
    for state in ("warm", "cold"):
        figures = paired(replays[0], replays[1:], evictor if state == "cold" else None, reps)
        for driver, (ns, ratio) in zip(replays[1:], figures, strict=True):
            est = median_estimate(ratio)
            rows.append({"state": state, "variant": driver.impl, "flat_over": est.value, "ci_low": est.low,
                         "ci_high": est.high, "variant_ns": float(np.median(ns)), "reps": reps})
    return rows


def _what(name: str) -> tuple[str, str]:
    if name in EDITS:
        return EDITS[name][1], EDITS[name][2]
    return YARDSTICKS[name], "no" if name == "unchecked-flat" else "yes"


def _cell(part: pd.DataFrame) -> str:
    above, below = int((part.ci_low > 1).sum()), int((part.ci_high < 1).sum())
    return (f"{part.flat_over.median():.3g} ({part.flat_over.min():.3g}-{part.flat_over.max():.3g}; "
            f"{above} / {below} of {len(part)})")


def summary(rows: pd.DataFrame, procs: int, machine: str, commit: str) -> str:
    """The README: per variant, `flat`'s time over it in each condition and state across the rounds."""
    head = ["# Where `flat`'s decode-step checks spend their time", "",
            f"Written by `python scripts/decode_account.py` at `{commit}` on {machine}: batched `flat` and each "
            "variant replay `paper` in one process, in turn on each slice (warm: nothing between slices; cold: the "
            "caches flushed before each), every round once idle and once beside `scripts/noisy_neighbour.py "
            f"--procs {procs}`. A variant is `flat`'s own decode step with one edit (`EDITS` in the script): a "
            "probe of what that part costs, not a design. Each cell: `flat`'s time over the variant's, the median "
            "of the rounds (each round the median of its repetitions' slice ratios), the rounds' range, and how "
            "many rounds' 95 % intervals lie above 1 (`flat` slower) / below 1. `decode_account.csv` has every "
            "round, with the variants' ns per sequence-step.", ""]
    states = [(c, s) for c in ("idle", "loaded") for s in ("warm", "cold")]
    cells = []
    for variant in rows.variant.drop_duplicates():
        what, contract = _what(variant)
        mine = rows[rows.variant == variant]
        cells.append([f"`{variant}`", what, contract, *(_cell(mine[(mine.condition == c) & (mine.state == s)])
                                                        for c, s in states)])
    header = ["variant", "what it changes", "keeps the contract", *(f"{c}, {s}" for c, s in states)]
    return "\n".join([*head, *markdown_table(header, cells)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each one idle pass and one loaded pass")
    parser.add_argument("--reps", type=int, default=7, help="repetitions per pass and state")
    parser.add_argument("--neighbour-procs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "decode_account")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 50 or not 2 <= args.reps <= 100:
        parser.error(f"--rounds {args.rounds} --reps {args.reps}: give 1 to 50 rounds and 2 to 100 repetitions")
    import subprocess

    import numba

    from harness.studies.cache_state import Evictor

    # The variants are compiled from edited source, which Numba's on-disk cache cannot load back: a private one.
    numba.config.CACHE_DIR = tempfile.mkdtemp(prefix="decode-account-numba-")
    replays, evictor, parts = drivers(contenders()), Evictor.make(), []
    for index in range(args.rounds):
        for condition in ("idle", "loaded") if index % 2 == 0 else ("loaded", "idle"):
            with neighbour(condition == "loaded", args.neighbour_procs, index):
                rows = measure(replays, evictor, args.reps)
            parts += [{"round": index, "condition": condition, **row} for row in rows]
            print(f"round {index + 1}/{args.rounds} {condition}: done", flush=True)
    frame = pd.DataFrame(parts)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "decode_account.csv", frame.to_csv(index=False))
    machine = machine_name({"cpu": cpu_identity()})
    atomic_write_text(args.out / "README.md", summary(frame, args.neighbour_procs, machine, commit))
    print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
