"""The id-width rule and the row size have one definition (impls/core/ids.py) that every design reads."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import numpy as np

from impls.core import ids
from impls.native import toolchain

ROOT = Path(__file__).resolve().parents[1]
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
LIMIT_LITERALS = {("65536",), ("65_536",), ("0x10000",), ("2", "**", "16"), ("1", "<<", "16")}


def limit_literals(source: str) -> list[int]:
    """Lines of Python code (not strings, docstrings or comments) that spell the uint16 limit as a number."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in _SKIP]
    return [toks[i].start[0] for i in range(len(toks)) for spelling in LIMIT_LITERALS
            if tuple(t.string.lower() for t in toks[i : i + len(spelling)]) == spelling]


def test_the_literal_finder_sees_code_not_prose() -> None:
    source = ('"""65536 blocks."""\nx = 65536  # 65536\ny = 65_536\nz = 2 ** 16\n'
              'w = 65537, "2**16", 2 ** 17, 2 if w else x ** 16\n')
    assert limit_literals(source) == [2, 3, 4]


def test_no_module_but_ids_spells_the_uint16_limit() -> None:
    owner = ROOT / "impls" / "core" / "ids.py"
    spelled = {str(path.relative_to(ROOT)): lines for folder in ("impls", "harness")
               for path in sorted((ROOT / folder).rglob("*.py")) if path != owner
               if (lines := limit_literals(path.read_text()))}
    assert spelled == {}, f"use impls.core.ids.UINT16_LIMIT / table_dtype instead: {spelled}"
    defined = [str(path.relative_to(ROOT)) for folder in ("impls", "harness")
               for path in sorted((ROOT / folder).rglob("*.py")) if path != owner
               if re.search(r"^(ROW_BYTES|UINT16_LIMIT)\s*=", path.read_text(), re.MULTILINE)]
    assert defined == []


def test_the_cpp_designs_read_the_rule_from_the_prelude() -> None:
    source = (ROOT / "impls" / "native" / "designs.cpp").read_text()
    code = "\n".join(line.split("//")[0] for line in source.splitlines())
    assert "65536" not in code and not re.search(r"ROW_BYTES\s*=", code)
    prelude = toolchain.contract_prelude()
    assert f"UINT16_LIMIT = {ids.UINT16_LIMIT};" in prelude and f"ROW_BYTES = {ids.ROW_BYTES};" in prelude


def test_ids_widen_past_the_limit() -> None:
    assert ids.table_dtype(ids.UINT16_LIMIT) == np.uint16 and ids.id_bytes(ids.UINT16_LIMIT) == 2
    assert ids.table_dtype(ids.UINT16_LIMIT + 1) == np.uint32 and ids.id_bytes(ids.UINT16_LIMIT + 1) == 4
