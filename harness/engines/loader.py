"""Importing an engine's block-manager modules, unmodified, from its published files and nothing else.
Design: docs/output.md#harnessenginesloaderpy."""

from __future__ import annotations
import __future__

import ast
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import operator
import sys
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


class StubTouched(RuntimeError):
    """The engine's code used a stand-in during a replay: the import plan stands in for code that runs."""


class PlanError(ImportError):
    """The engine's modules import something the plan does not name (or a named file is missing)."""


@dataclass(frozen=True)
class Piece:
    """Top-level definitions compiled from one of the engine's files into a module of their own."""

    source: str
    names: tuple[str, ...]
    globals: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportPlan:
    """Which of an engine's modules run from its files, and what stands in for the others."""

    packages: tuple[str, ...]
    real: tuple[str, ...]
    stubs: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    pieces: Mapping[str, Piece] = field(default_factory=dict)
    external_stubs: tuple[str, ...] = ()
    compiled: tuple[str, ...] = ()  # packages imported whole from the folder, compiled extensions included

    def owns(self, name: str) -> bool:
        return name.partition(".")[0] in self.packages

    def named(self) -> set[str]:
        return {*self.real, *self.stubs, *self.pieces}

    def shells(self) -> set[str]:
        """The packages above every named module (their ``__init__`` never runs)."""
        out = set()
        for name in self.named():
            parts = name.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts)))
        return out - self.named()

    def describe(self) -> str:
        """One line for the results: what ran from the engine's files, what stood in."""
        stubs = sorted([*self.stubs, *self.external_stubs])
        pieces = [f"{p.source}:{','.join(p.names)}" for p in self.pieces.values()]
        parts = [f"run from the package's files: {', '.join(sorted(self.real))}"] if self.real else []
        if self.compiled:
            parts.append(f"imported whole from the wheels' files (compiled parts included): {', '.join(self.compiled)}")
        return ("; ".join(parts)
                + (f"; definitions compiled from: {'; '.join(pieces)}" if pieces else "")
                + (f"; stand-ins: {', '.join(stubs)}" if stubs else ""))


class _Tripwire:
    """Whether stand-ins may still be touched (while the engine's modules import) or not (during replays)."""

    armed = False


def _touched(what: str) -> StubTouched:
    return StubTouched(f"the engine's code used the stand-in {what} during the replay; the import plan "
                       "(harness/calibration) must load that code from the engine's files instead")


class _StubMeta(type):
    """Stand-in classes: attributes are stand-ins, subscripts and calls give stand-ins, until armed."""

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if _Tripwire.armed:
            raise _touched(f"{cls.__qualname__}.{name}")
        return stub_class(f"{cls.__qualname__}.{name}", cls.__module__)

    def __call__(cls, *args, **kwargs):
        if _Tripwire.armed:
            raise _touched(f"{cls.__qualname__}(...)")
        return super().__call__()

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())


class _StubBase(metaclass=_StubMeta):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)

    def __call__(self, *args, **kwargs):
        return type(self)()

    def __or__(self, other):
        return self

    __ror__ = __or__


def stub_class(qualname: str, module: str) -> type:
    """A fresh stand-in class named ``qualname``."""
    cls = _StubMeta(qualname.rpartition(".")[2], (_StubBase,), {"__module__": module})
    cls.__qualname__ = qualname
    return cls


class StubModule(types.ModuleType):
    """A stand-in module: the given attributes, and any other name as a stand-in class."""

    def __init__(self, name: str, attrs: Mapping[str, object] | None = None) -> None:
        super().__init__(name, "stand-in module (harness.engines.loader)")
        self.__dict__.update(attrs or {})

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(f"stand-in module {self.__name__} has no {attr!r}")
        if _Tripwire.armed:
            raise _touched(f"{self.__name__}.{attr}")
        value = stub_class(attr, self.__name__)
        setattr(self, attr, value)
        return value


class _FileLoader(importlib.machinery.SourceFileLoader):
    """The standard source loader, minus writing bytecode next to the engine's files (the user's folder)."""

    def set_data(self, path, data, *, _mode=0o666) -> None:
        return None


class _ModuleLoader(importlib.abc.Loader):
    """Hands the import system a module built beforehand (shell, stand-in or pieces)."""

    def __init__(self, make) -> None:
        self.make = make

    def create_module(self, spec):
        return self.make(spec)

    def exec_module(self, module) -> None:
        return None


class EngineImports(importlib.abc.MetaPathFinder):
    """Serves the engine's modules from ``root`` (the folder holding its top-level packages) by ``plan``."""

    def __init__(self, plan: ImportPlan, root: Path) -> None:
        self.plan, self.root = plan, Path(root)
        self.shells = plan.shells()
        self.loaded: list[str] = []

    def arm(self) -> None:
        """From now on, touching a stand-in raises :class:`StubTouched`."""
        _Tripwire.armed = True

    def file_of(self, name: str) -> Path:
        base = self.root.joinpath(*name.split("."))
        return base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if fullname in self.plan.external_stubs or top in self.plan.external_stubs:
            return self._made(fullname, lambda spec: StubModule(spec.name), package=True)
        if not self.plan.owns(fullname):
            return None
        if top in self.plan.compiled:
            return self._compiled(fullname, path)
        if fullname in self.plan.real:
            return self._real(fullname)
        if fullname in self.plan.pieces:
            return self._made(fullname, self._pieces_module)
        if fullname in self.plan.stubs:
            return self._made(fullname, lambda spec: StubModule(spec.name, self.plan.stubs[spec.name]),
                              package=True)
        if fullname in self.shells:
            return self._made(fullname, self._shell, package=True)
        raise PlanError(f"{fullname} is imported by the engine's modules but the calibration's import plan "
                        f"does not name it (harness/calibration): load it from the files or stand in for it")

    def _compiled(self, name: str, path):
        """The standard path finder's spec, searched under the folder only (never an installed copy)."""
        spec = importlib.machinery.PathFinder.find_spec(name, [str(self.root)] if path is None else path)
        if spec is None or spec.origin is None or not Path(spec.origin).resolve().is_relative_to(self.root.resolve()):
            raise PlanError(f"{name}: not found under {self.root}; is the engine's wheel unpacked there whole?")
        self.loaded.append(name)
        return spec

    def _real(self, name: str):
        path = self.file_of(name)
        if not path.is_file():
            raise PlanError(f"{name}: no file {path} in the engine's package; is this the engine's layout?")
        self.loaded.append(name)
        search = [str(path.parent)] if path.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(name, path, loader=_FileLoader(name, str(path)),
                                                      submodule_search_locations=search)

    def _made(self, name: str, make, package: bool = False):
        self.loaded.append(name)
        spec = importlib.machinery.ModuleSpec(name, _ModuleLoader(make), is_package=package)
        if package:
            spec.submodule_search_locations = [str(self.root.joinpath(*name.split(".")))]
        return spec

    def _shell(self, spec) -> types.ModuleType:
        module = types.ModuleType(spec.name, "package shell: its __init__.py is not run (harness.calibration)")
        module.__path__ = list(spec.submodule_search_locations or [])
        return module

    def _pieces_module(self, spec) -> types.ModuleType:
        piece = self.plan.pieces[spec.name]
        path = self.file_of(piece.source)
        if not path.is_file():
            raise PlanError(f"{piece.source}: no file {path} in the engine's package")
        module = StubModule(spec.name, piece.globals)
        module.__file__ = str(path)
        tree = ast.parse(path.read_text(), str(path))
        flags = future_flags(tree)
        for node in definitions(tree, piece.names, path):
            code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec", flags=flags, dont_inherit=True)
            try:
                exec(code, module.__dict__)
            except NameError as exc:
                raise PlanError(f"{spec.name}: {_defines(node)} from {path} needs {exc.name!r}: give it in the "
                                "plan's Piece globals") from exc
        return module


def _defines(node: ast.stmt) -> str | None:
    """The name a top-level ``def``, ``class`` or ``NAME = ...`` statement defines, else None."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def future_flags(tree: ast.Module) -> int:
    """The compiler flags of the file's ``from __future__ import ...`` (so its definitions compile as they do in it)."""
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            flags |= functools.reduce(operator.or_, (getattr(__future__, a.name).compiler_flag for a in node.names), 0)
    return flags


def definitions(tree: ast.Module, names: tuple[str, ...], path: Path) -> list[ast.stmt]:
    """The top-level statements of the file (``tree``, from ``path``) that define ``names``, in the file's order."""
    found = [node for node in tree.body if _defines(node) in names]
    missing = set(names) - {_defines(node) for node in found}
    if missing:
        raise PlanError(f"{path}: no top-level definition of {', '.join(sorted(missing))}")
    return found


@contextmanager
def engine_imports(plan: ImportPlan, root: Path) -> Iterator[EngineImports]:
    """Within the block, the engine's packages import by ``plan`` from ``root``; on exit its modules are dropped."""
    clashing = sorted(name for name in sys.modules if plan.owns(name) or name.partition(".")[0] in plan.external_stubs)
    for name in clashing:  # an installed copy of the engine must not answer for the published files
        del sys.modules[name]
    finder = EngineImports(plan, root)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        _Tripwire.armed = False
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if plan.owns(n) or n.partition(".")[0] in plan.external_stubs]:
            del sys.modules[name]
