"""KV-cache BlockManager implementations behind one contract (see :mod:`impls.contract`).

Which implementations exist, and every fact about each, is in :mod:`impls.registry`. ``REGISTRY`` maps the
names that import here to their classes; ``UNAVAILABLE`` maps the others to what to install.
"""

# ruff: noqa: E402  (Numba's cache folder must be chosen before any kernel is decorated)

from ._numba_cache import pin_numba_cache

pin_numba_cache()  # before any @njit(cache=True) in the modules the registry imports

from .contract import BlockManager, NoFreeBlocksError
from .registry import RECORDS, load_all

REGISTRY: dict[str, type]
UNAVAILABLE: dict[str, str]
REGISTRY, UNAVAILABLE = load_all()

__all__ = ["RECORDS", "REGISTRY", "UNAVAILABLE", "BlockManager", "NoFreeBlocksError"]
