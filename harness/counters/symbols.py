"""Names of Numba-compiled functions by address: callgrind sees JIT code only as addresses.

A replay loop loaded from Numba's cache keeps no object code to read names from. This module, run with an empty
Numba cache (``python -m harness.counters.symbols``), compiles the cells' replay loops as the measured cache was
filled, kernels linked in, and writes where each function sits from its loop's start (:func:`layouts`); the
valgrind run writes where each loop starts (:func:`starts`); :func:`names` joins them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

_PART = re.compile(r"(\d+)")


def demangle(name: str) -> str:
    """A Numba symbol's dotted name (``_ZN5impls7designs4flat11decode_stepB3v34...`` -> ``impls.designs.flat.
    decode_step``); other names as they are."""
    if not name.startswith("_ZN"):
        return name
    parts, at = [], 3
    while at < len(name):
        match = _PART.match(name, at)
        if match is None:
            break
        size, at = int(match.group(1)), match.end()
        parts.append(name[at : at + size])
        at += size
    return ".".join(parts) or name


def _symbols(obj: bytes) -> dict[str, int]:
    """Defined functions of an object file and their offsets (``nm``); empty without binutils."""
    nm = shutil.which("nm")
    if nm is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(obj)
        f.flush()
        out = subprocess.run([nm, "--defined-only", f.name], capture_output=True, text=True, check=False).stdout
    fields = [line.split() for line in out.splitlines()]
    return {f[2]: int(f[0], 16) for f in fields if len(f) == 3 and f[1] in "tTWw"}


def _drives() -> dict[str, object]:
    from harness.base.drivers import COMPILED_DRIVERS

    return {f"{module}|{caching}": drive for (module, caching), drive in COMPILED_DRIVERS.items()}


def layouts() -> dict[str, dict[str, int]]:
    """Per replay loop compiled in this process: every function its code holds, by offset from the loop's own."""
    found = {}
    for key, drive in _drives().items():
        for ov in drive.overloads.values():
            symbols = _symbols(ov.library.serialize_using_object_code()[2][0])
            base = symbols.get(ov.fndesc.llvm_func_name)
            if base is not None:
                found[key] = {demangle(name): offset - base for name, offset in symbols.items()}
    return found


def starts() -> dict[str, int]:
    """Where each replay loop of this process starts, and Numba's reference counting functions."""
    from numba.core.runtime import nrt

    found = {name: nrt.rtsys.library.get_pointer_to_function(name) for name in ("NRT_incref", "NRT_decref")}
    for key, drive in _drives().items():
        for ov in drive.overloads.values():
            found[key] = ov.library.get_pointer_to_function(ov.fndesc.llvm_func_name)
    return found


def names(layout: dict[str, dict[str, int]], start: dict[str, int]) -> dict[str, str]:
    """``{0x + 16 hex digits (callgrind's name for a JIT function): its dotted name}``."""
    found = {f"0x{address:016x}": name for name, address in start.items() if "|" not in name}
    for key, offsets in layout.items():
        if key in start:
            found.update({f"0x{start[key] + offset:016x}": name for name, offset in offsets.items()})
    return found


def main(argv: list[str] | None = None) -> int:
    """Compile the cells' replay loops (give this process an empty ``NUMBA_CACHE_DIR``) and write their layouts."""
    import argparse
    from pathlib import Path

    from harness.base.drivers import Prepared, compiled_step_runner, driver_for
    from harness.base.files import write_json
    from impls import REGISTRY
    from scenarios import load

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--trace", required=True)
    parser.add_argument("--cell", nargs=2, action="append", metavar=("IMPL", "REGIME"), required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    prep = Prepared.from_trace(load(args.trace))
    for impl, regime in args.cell:
        cls = REGISTRY[impl]
        if regime == "batched" and getattr(cls, "kernels", None) is not None:  # a compiled replay loop
            compiled_step_runner(prep, cls(**prep.trace.config), driver_for(cls.kernels, prep))(0, 1)
    write_json(Path(args.out), layouts())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
