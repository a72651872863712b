"""Where the instructions go: the kinds of work functions are put in, the table, and the docs' copy of it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from harness.counters import where
from harness.counters.symbols import demangle, names

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("where_instructions", ROOT / "scripts" / "where_instructions.py")
where_instructions = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(where_instructions)


@pytest.mark.parametrize(("name", "kind"), [
    ("harness.base.drivers.replay_loop_impls_designs_flat", "replay loop"),
    ("_3cdynamic_3e.spread", "replay loop"),
    ("???:0x0000000000006250 [/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2]", "replay loop"),
    ("impls.designs.flat.decode_step", "decode step"),
    ("???:(anonymous namespace)::FlatDesign<unsigned short>::slow_slot(FlatRec*, long*, long&) [x.so]",
     "decode step"),
    ("???:(anonymous namespace)::Direct<M>::free(void*, long) [x.so]", "pool ops"),
    ("impls.designs.flat_rows.free", "pool ops"),
    ("numba.typed.dictobject.impl_getitem._3clocals_3e.impl", "containers"),
    ("NRT_decref", "runtime"),
    ("./malloc/./malloc/malloc.c:_int_free [libc.so.6]", "runtime"),
    ("/tmp/python/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault [libpython3.11.so]", "interpreter"),
    ("???:0x0000000007dc9c40 [???]", "other"),  # a compiled function no symbol named
])
def test_functions_go_to_their_kind_of_work(name: str, kind: str) -> None:
    assert where.kind_of(name) == kind


def test_numba_names_are_demangled_and_placed_from_their_loop() -> None:
    assert demangle("_ZN5impls7designs4flat11decode_stepB3v34B40c8tJTIeFIjxE5Array") == "impls.designs.flat.decode_step"
    assert demangle("NRT_incref") == "NRT_incref"
    named = names({"m|False": {"loop": 0, "kernel": 0x2c40}}, {"m|False": 0x7dc7000, "NRT_incref": 0x543c050})
    assert named == {"0x0000000007dc7000": "loop", "0x0000000007dc9c40": "kernel", "0x000000000543c050": "NRT_incref"}


def test_markdown_rows_sum_to_the_total() -> None:
    kinds = dict.fromkeys(where.KINDS, 0.0) | {"replay loop": 5.0, "decode step": 20.0}
    table = where_instructions.markdown({"flat batched": {"per_kind": kinds, "total": 25.0, "functions": {}}})
    head, _, row = table.splitlines()
    assert head.split(" | ")[1:-1] == list(where.KINDS)
    assert row.startswith("| flat batched | 5.0 | 20.0 |") and row.endswith("| 25.0 |")


def test_the_docs_table_is_the_generated_one() -> None:
    """docs/measurement.md carries results/where/where.md between its markers, as the script wrote both."""
    docs = (ROOT / "docs" / "measurement.md").read_text()
    block = re.search(r"<!-- where:begin -->\n(.*?)<!-- where:end -->", docs, re.DOTALL)
    assert block is not None and block.group(1) == (ROOT / "results" / "where" / "where.md").read_text()
