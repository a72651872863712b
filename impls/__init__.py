"""KV-cache BlockManager implementations behind one contract (see :mod:`impls.contract`)."""

from .contract import BlockManager, NoFreeBlocksError
from .dict_design import DictBlockManager
from .dict_jit import DictJitBlockManager
from .flat import FlatBlockManager
from .list_design import ListBlockManager
from .list_jit import ListJitBlockManager

REGISTRY: dict[str, type] = {
    "dict": DictBlockManager,
    "list": ListBlockManager,
    "flat": FlatBlockManager,
    "dict-jit": DictJitBlockManager,
    "list-jit": ListJitBlockManager,
}

__all__ = ["REGISTRY", "BlockManager", "NoFreeBlocksError"]
