"""Block-id width: uint16 ids while the pool fits them (the article's rule 2), else uint32; rows of 64 bytes."""

from __future__ import annotations

import numpy as np

UINT16_LIMIT = 65536  # pools up to this many blocks keep uint16 ids
ROW_BYTES = 64  # one cache line: a row of ids in flat-rows and cpp-flat-rows


def table_dtype(num_blocks: int) -> np.dtype:
    """uint16 ids while they fit, else uint32."""
    return np.dtype(np.uint16) if num_blocks <= UINT16_LIMIT else np.dtype(np.uint32)


def id_bytes(num_blocks: int) -> int:
    """Bytes per block id of a pool of ``num_blocks``."""
    return table_dtype(num_blocks).itemsize
