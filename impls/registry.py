"""Every implementation in one table: what it is, how it is shown, what it needs."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib import metadata as importlib_metadata

ROLES = ("design", "twin", "contender", "native", "caching", "plugin")
ENTRY_POINT_GROUP = "kvblock_bench.impls"
ROLE_PACKAGES = {"design": "impls.designs", "twin": "impls.designs", "caching": "impls.caching",
                 "contender": "impls.contenders", "native": "impls.native"}
SUPPORT_MODULES = ("impls.designs.twins", "impls.native.binding", "impls.native.toolchain",
                   "impls.contenders.vllm_v1_pool")
RATIO_BASE = "flat"
CACHING_RATIO_BASE = "flat-pc"


@dataclass(frozen=True)
class Impl:
    """One implementation's facts. ``target`` is ``"module:Class"``; ``letter`` is the article's design."""

    name: str
    target: str
    role: str
    label: str
    description: str
    color: str
    letter: str | None = None
    needs: str = ""  # what to install when the module cannot be imported here
    untimed_hook: bool = False  # may define untimed_after_step, the Python drivers' untimed per-step hook
    twin_of: str = ""

    @property
    def compares_with_article(self) -> bool:
        """True for the article's designs A, B, C, in Python/Numba and in C++ (its figures sit beside theirs)."""
        return self.role in ("design", "native") and self.letter is not None

    def load(self) -> type:
        """Import and return the class (``ImportError`` when a dependency is missing)."""
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


RECORDS: tuple[Impl, ...] = (
    Impl("dict", "impls.designs.dict_design:DictBlockManager", "design", "A dict", "hash map per sequence",
         "#0072B2", "A"),
    Impl("list", "impls.designs.list_design:ListBlockManager", "design", "B list", "growable list per sequence",
         "#E69F00", "B"),
    Impl("flat", "impls.designs.flat:FlatBlockManager", "design", "C flat", "flat table + free stack", "#009E73", "C"),
    Impl("flat-rows", "impls.designs.flat_rows:FlatRowsBlockManager", "design", "flat-rows",
         "two-level flat table: 64-byte rows from a row pool", "#EE3377"),
    Impl("dict-jit", "impls.designs.dict_jit:DictJitBlockManager", "twin", "A' dict-jit", "A compiled (typed.Dict)",
         "#9CD3F5", "A"),
    Impl("list-jit", "impls.designs.list_jit:ListJitBlockManager", "twin", "B' list-jit",
         "B compiled (doubling arrays)", "#F5D07A", "B"),
    Impl("vllm-v1", "impls.contenders.vllm_v1:VllmV1BlockManager", "contender", "vllm-v1",
         "vLLM v1 allocate_slots per request per step", "#CC79A7"),
    Impl("vllm-v1-pc", "impls.contenders.vllm_v1_pc:VllmV1CachingBlockManager", "contender", "vllm-v1-pc",
         "vLLM v1 with prefix caching on (its default)", "#AA4499"),
    Impl("nano-vllm", "impls.contenders.nano_vllm:NanoVllmBlockManager", "contender", "nano-vllm",
         "nano-vllm can/may_append (deque of free ids)", "#8C564B"),
    Impl("sglang", "impls.contenders.sglang:SGLangBlockManager", "contender", "sglang",
         "SGLang batched page allocator (torch)", "#D55E00", needs="needs torch: pip install -e '.[torch]'"),
    Impl("lmdeploy", "impls.contenders.lmdeploy:LmdeployBlockManager", "contender", "lmdeploy",
         "LMDeploy logical/physical NumPy allocators, per-sequence NumPy tables", "#00C853"),
    Impl("lmdeploy-pc", "impls.contenders.lmdeploy_pc:LmdeployCachingBlockManager", "contender", "lmdeploy-pc",
         "LMDeploy with prefix caching on (its block trie)", "#004D40"),
    Impl("flat-pc", "impls.caching.flat_pc:FlatPcBlockManager", "caching", "C flat-pc",
         "flat + open-addressing hash table and intrusive LRU (prefix caching)", "#B2DF8A"),
    Impl("dict-pc", "impls.caching.dict_pc:DictPcBlockManager", "caching", "A dict-pc",
         "A + vLLM v1's prefix cache (hash dict + intrusive LRU)", "#4EC3C9"),
    Impl("radix-pc", "impls.caching.radix_pc:RadixPcBlockManager", "caching", "radix-pc",
         "B + SGLang's radix tree over block hashes (prefix caching)", "#EE8866"),
    Impl("cpp-dict", "impls.native.available:CppDictBlockManager", "native", "A cpp-dict",
         "A in C++ (std::unordered_map per sequence)", "#332288", "A", twin_of="dict-jit"),
    Impl("cpp-list", "impls.native.available:CppListBlockManager", "native", "B cpp-list",
         "B in C++ (std::vector per sequence)", "#7F3C00", "B", twin_of="list-jit"),
    Impl("cpp-flat", "impls.native.available:CppFlatBlockManager", "native", "C cpp-flat",
         "C in C++ (flat uint16 table + free stack)", "#66A61E", "C", twin_of="flat"),
    Impl("cpp-flat-rows", "impls.native.available:CppFlatRowsBlockManager", "native", "cpp-flat-rows",
         "flat-rows in C++ (64-byte rows from a row pool)", "#A50026", twin_of="flat-rows"),
)

BY_NAME: dict[str, Impl] = {r.name: r for r in RECORDS}
# Plug-ins' colours in the order a run names them, far from every record's and each other's (tests/test_figures.py)
PLUGIN_COLORS = ("#E41A1C", "#0000FF", "#7F7F7F", "#FF00FF", "#637939", "#C2B709", "#756BB1", "#8C6D31", "#D6616B")


def names(*roles: str) -> list[str]:
    """Registered names with one of ``roles`` (all when none given), in the registry's order."""
    return [r.name for r in RECORDS if not roles or r.role in roles]


def cpp_twin(name: str) -> str | None:
    """The native record that reimplements compiled design ``name`` (its ``twin_of``), if any."""
    return next((r.name for r in RECORDS if r.twin_of == name), None)


def record(name: str) -> Impl:
    """The record of a registered name, or of a plug-in (a plain record with role ``plugin``)."""
    if name in BY_NAME:
        return BY_NAME[name]
    return Impl(name, name, "plugin", name, "user implementation", "")


def load_all() -> tuple[dict[str, type], dict[str, str]]:
    """(name -> class for what imports here, name -> what to install for what does not)."""
    classes: dict[str, type] = {}
    missing: dict[str, str] = {}
    for rec in RECORDS:
        try:
            classes[rec.name] = rec.load()
        except ImportError as exc:
            missing[rec.name] = rec.needs or str(exc)
    return classes, missing


class PluginError(ValueError):
    """An implementation named on the command line could not be loaded; the message says why."""


def load_plugin(spec: str) -> type:
    """The class named by ``package.module:Class`` or registered under the ``kvblock_bench.impls`` entry points."""
    if ":" not in spec:
        found = [ep for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if not found:
            raise PluginError(f"unknown implementation {spec!r}: not registered, and not of the form "
                              f"package.module:Class")
        spec = found[0].value
    module, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise PluginError(f"implementation {spec!r}: cannot import {module!r} ({exc})") from None
    except AttributeError:
        raise PluginError(f"implementation {spec!r}: module {module!r} has no attribute {attr!r}") from None
    if not isinstance(cls, type):
        raise PluginError(f"implementation {spec!r}: {attr!r} is not a class")
    problem = contract_shape_problem(cls)
    if problem:
        raise PluginError(f"implementation {spec!r}: {problem}")
    return cls


CONTRACT_METHODS = {
    "can_allocate": 1, "allocate": 2, "append_slot": 1, "fork": 2, "free": 1, "block_table": 1, "seq_len": 1,
    "num_free_blocks": 0, "ref_count": 1, "last_slot": 1, "decode_step": 3, "lookup": 2, "table_nbytes": 1,
}
OPTIONAL_METHODS = {"step": 7}
PROBE_CONFIG = {"num_blocks": 64, "block_size": 16, "max_seqs": 4, "max_blocks_per_seq": 8}


def contract_shape_problem(cls: type) -> str:
    """What keeps ``cls`` from being called as the contract calls it ("" when nothing)."""
    try:
        inspect.signature(cls).bind(**PROBE_CONFIG)
    except TypeError as exc:
        return (f"its constructor cannot be called as cls(num_blocks, block_size=16, max_seqs=256, "
                f"max_blocks_per_seq=256): {exc}")
    except ValueError:
        pass
    subject, problem = _methods_holder(cls)
    if problem:
        return problem
    required = [(name, arity, True) for name, arity in CONTRACT_METHODS.items()]
    for name, arity, needed in [*required, *((n, a, False) for n, a in OPTIONAL_METHODS.items())]:
        method = getattr(subject, name, None)
        if not callable(method):
            if needed:
                return f"missing contract method {name} (see impls/contract.py)"
            continue
        try:
            inspect.signature(method).bind(*([None] if subject is cls else []), *range(arity))
        except TypeError:
            return f"{name} does not take {arity} argument(s) as the contract calls it (see impls/contract.py)"
        except ValueError:
            continue
    return ""


def _methods_holder(cls: type) -> tuple[object, str]:
    """Where ``cls``'s contract methods are: the class, or a small instance when some come from ``__getattr__``."""
    if all(callable(getattr(cls, name, None)) for name in CONTRACT_METHODS) or not hasattr(cls, "__getattr__"):
        return cls, ""
    try:
        return cls(**PROBE_CONFIG), ""
    except Exception as exc:
        return cls, (f"its contract methods come from __getattr__, and a small instance to look them up on could "
                     f"not be made: cls({', '.join(f'{k}={v}' for k, v in PROBE_CONFIG.items())}) raised "
                     f"{type(exc).__name__}: {exc}")
