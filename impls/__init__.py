"""KV-cache BlockManager implementations behind one contract (see :mod:`impls.contract`)."""

from __future__ import annotations

from impls.core.numba_cache import pin_numba_cache

pin_numba_cache()  # before any @njit(cache=True) in the modules the registry imports

from impls.contract import BlockManager, NoFreeBlocksError  # noqa: E402
from impls.registry import RECORDS, load_all  # noqa: E402

REGISTRY: dict[str, type]
UNAVAILABLE: dict[str, str]


def __getattr__(name: str) -> object:
    if name in ("REGISTRY", "UNAVAILABLE"):
        registry, unavailable = load_all()
        globals().update(REGISTRY=registry, UNAVAILABLE=unavailable)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RECORDS", "REGISTRY", "UNAVAILABLE", "BlockManager", "NoFreeBlocksError"]
