"""Every implementation in one table: what it is, how it is shown, what it needs.

One :class:`Impl` record per implementation is the only place its facts live; the runner, the reports, the
figures, the gate, the command line and the tests all read them from here. Adding an implementation means
writing its module and adding one record to :data:`RECORDS`.

Roles:

- ``design``: the article's designs A, B, C, as interpreted Python (``flat`` is compiled: its design *is* the
  preallocated arrays and the kernels over them);
- ``twin``: a compiled twin of design A or B, so that the batched regime compares data structures under
  compilation, as the article's C++ did;
- ``contender``: a model of a real engine's block manager;
- ``native``: C++ builds of the article's designs, replayed inside C++ (see :mod:`impls.native`; unavailable
  without a C++ compiler);
- ``caching``: a design with prefix caching (:class:`impls.contract.CachingBlockManager`, class attribute
  ``prefix_caching = True``), held to the reference model's hits and evictions (``tests/test_prefix_caching.py``
  runs every such class); it runs on the caching scenarios (see :data:`harness.measure.matrix.CELL_RULES`);
- ``plugin``: a user's implementation, loaded by ``package.module:Class`` or the ``kvblock_bench.impls``
  entry-point group (see :func:`resolve`).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib import metadata as importlib_metadata

ROLES = ("design", "twin", "contender", "native", "caching", "plugin")
ENTRY_POINT_GROUP = "kvblock_bench.impls"
# The subpackage of ``impls`` each role's classes live in (a plug-in lives in its own package), and the modules
# of those subpackages that support the registered ones without being implementations themselves.
ROLE_PACKAGES = {"design": "impls.designs", "twin": "impls.designs", "caching": "impls.caching",
                 "contender": "impls.contenders", "native": "impls.native"}
SUPPORT_MODULES = ("impls.native.binding", "impls.native.toolchain")


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
         "#1f77b4", "A"),
    Impl("list", "impls.designs.list_design:ListBlockManager", "design", "B list", "growable list per sequence",
         "#ff7f0e", "B"),
    Impl("flat", "impls.designs.flat:FlatBlockManager", "design", "C flat", "flat table + free stack", "#2ca02c", "C"),
    # Not the article's design (no letter): C's table in two levels, rows from a pool (issue 29).
    Impl("flat-rows", "impls.designs.flat_rows:FlatRowsBlockManager", "design", "flat-rows",
         "two-level flat table: 64-byte rows from a row pool", "#d62728"),
    Impl("dict-jit", "impls.designs.dict_jit:DictJitBlockManager", "twin", "A' dict-jit", "A compiled (typed.Dict)",
         "#9ecae1", "A"),
    Impl("list-jit", "impls.designs.list_jit:ListJitBlockManager", "twin", "B' list-jit",
         "B compiled (doubling arrays)", "#fdae6b", "B"),
    Impl("vllm-v1", "impls.contenders.vllm_v1:VllmV1BlockManager", "contender", "vllm-v1",
         "vLLM v1 allocate_slots per request per step", "#9467bd"),
    Impl("vllm-v1-pc", "impls.contenders.vllm_v1_pc:VllmV1CachingBlockManager", "contender", "vllm-v1+pc",
         "vLLM v1 with prefix caching on (its default)", "#c5b0d5"),
    Impl("nano-vllm", "impls.contenders.nano_vllm:NanoVllmBlockManager", "contender", "nano-vllm",
         "nano-vllm can/may_append (deque of free ids)", "#8c564b"),
    Impl("sglang", "impls.contenders.sglang:SGLangBlockManager", "contender", "sglang",
         "SGLang batched page allocator (torch)", "#e377c2", needs="needs torch: pip install -e '.[torch]'"),
    Impl("flat-pc", "impls.caching.flat_pc:FlatPcBlockManager", "caching", "C flat-pc",
         "flat + open-addressing hash table and intrusive LRU (prefix caching)", "#74c476"),
    Impl("dict-pc", "impls.caching.dict_pc:DictPcBlockManager", "caching", "A dict-pc",
         "A + vLLM v1's prefix cache (hash dict + intrusive LRU)", "#17becf"),
    Impl("radix-pc", "impls.caching.radix_pc:RadixPcBlockManager", "caching", "radix-pc",
         "B + SGLang's radix tree over block hashes (prefix caching)", "#bcbd22"),
    # The article's designs in its own language, replayed inside C++ (see impls/native).
    Impl("cpp-dict", "impls.native.available:CppDictBlockManager", "native", "A cpp-dict",
         "A in C++ (std::unordered_map per sequence)", "#08306b", "A"),
    Impl("cpp-list", "impls.native.available:CppListBlockManager", "native", "B cpp-list",
         "B in C++ (std::vector per sequence)", "#7f2704", "B"),
    Impl("cpp-flat", "impls.native.available:CppFlatBlockManager", "native", "C cpp-flat",
         "C in C++ (flat uint16 table + free stack)", "#00441b", "C"),
)

BY_NAME: dict[str, Impl] = {r.name: r for r in RECORDS}


def names(*roles: str) -> list[str]:
    """Registered names with one of ``roles`` (all when none given), in the registry's order."""
    return [r.name for r in RECORDS if not roles or r.role in roles]


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


# Each contract method and the arguments it takes (after self), as in impls.contract.BlockManager.
CONTRACT_METHODS = {
    "can_allocate": 1, "allocate": 2, "append_slot": 1, "fork": 2, "free": 1, "block_table": 1, "seq_len": 1,
    "num_free_blocks": 0, "ref_count": 1, "last_slot": 1, "decode_step": 3, "lookup": 2, "table_nbytes": 1,
}


def contract_shape_problem(cls: type) -> str:
    """What keeps ``cls`` from being called as the contract calls it ("" when nothing): a missing method, a
    method or constructor that cannot take the contract's arguments."""
    missing = [name for name in CONTRACT_METHODS if not callable(getattr(cls, name, None))]
    if missing:
        return f"missing contract method(s) {', '.join(missing)} (see impls/contract.py)"
    try:
        inspect.signature(cls).bind(num_blocks=1, block_size=16, max_seqs=1, max_blocks_per_seq=1)
    except TypeError as exc:
        return (f"its constructor cannot be called as cls(num_blocks, block_size=16, max_seqs=256, "
                f"max_blocks_per_seq=256): {exc}")
    except ValueError:
        pass  # no signature to inspect (a builtin): calls will tell
    for name, arity in CONTRACT_METHODS.items():
        try:
            inspect.signature(getattr(cls, name)).bind(None, *range(arity))
        except TypeError:
            return f"{name} does not take {arity} argument(s) as the contract calls it (see impls/contract.py)"
        except ValueError:
            continue
    return ""
