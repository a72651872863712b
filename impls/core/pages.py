"""Arrays a constructor allocates, every page written at once. Design: docs/method.md#where-a-designs-arrays-live."""

from __future__ import annotations

import numpy as np


def resident_zeros(shape: tuple[int, ...] | int, dtype: np.dtype | type) -> np.ndarray:
    """Zeros, every page of them written now."""
    array = np.empty(shape, dtype=dtype)
    array.fill(0)
    return array

