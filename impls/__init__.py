"""KV-cache BlockManager implementations behind one contract (see :mod:`impls.contract`)."""

# ruff: noqa: E402  (Numba's cache folder must be chosen before the kernels below are decorated)

from ._numba_cache import pin_numba_cache

pin_numba_cache()  # before any @njit(cache=True) below is decorated

from .contract import BlockManager, NoFreeBlocksError
from .dict_design import DictBlockManager
from .dict_jit import DictJitBlockManager
from .flat import FlatBlockManager
from .list_design import ListBlockManager
from .list_jit import ListJitBlockManager
from .nano_vllm import NanoVllmBlockManager
from .vllm_v1 import VllmV1BlockManager

REGISTRY: dict[str, type] = {
    "dict": DictBlockManager,
    "list": ListBlockManager,
    "flat": FlatBlockManager,
    "dict-jit": DictJitBlockManager,
    "list-jit": ListJitBlockManager,
    # Contenders: the published designs of real engines, under the same contract.
    "vllm-v1": VllmV1BlockManager,
    "nano-vllm": NanoVllmBlockManager,
}

# Registered names that cannot run in this environment -> what to install.
UNAVAILABLE: dict[str, str] = {}

try:
    import torch  # noqa: F401  (torch is an optional extra; only the "sglang" contender needs it)
except ImportError:
    UNAVAILABLE["sglang"] = "needs torch: pip install -e '.[torch]'"
else:
    from .sglang import SGLangBlockManager

    REGISTRY["sglang"] = SGLangBlockManager

__all__ = ["REGISTRY", "UNAVAILABLE", "BlockManager", "NoFreeBlocksError"]
