"""ARCHITECTURE.md, the tree and the registry agree, and every "does not import" it states holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import harness
from impls import registry

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text()
LAYOUT = (ROOT / "docs" / "layout.md").read_text()


def table_rows() -> dict[str, list[str]]:
    """ARCHITECTURE.md's folder table: folder -> the packages its modules never import."""
    rows = {}
    for line in ARCHITECTURE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("/`"):
            rows[cells[0].strip("`").rstrip("/")] = re.findall(r"`([\w.]+)`", cells[2])
    return rows


ROWS = table_rows()


def packages() -> list[str]:
    """Every Python package folder of the code's top-level folders, as a path relative to the root."""
    found = []
    for top in ("impls", "harness", "scenarios"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.append(init.parent.relative_to(ROOT).as_posix())
    return found


def owner(package: str) -> str:
    """The table row that owns ``package``: the longest folder of the table containing it."""
    matching = [f for f in ROWS if package == f or package.startswith(f + "/")]
    return max(matching, key=len) if matching else ""


def test_the_table_lists_every_folder_of_the_tree_and_nothing_else() -> None:
    assert ROWS, "ARCHITECTURE.md has no folder table"
    for folder in ROWS:
        assert (ROOT / folder).is_dir(), f"ARCHITECTURE.md lists {folder}/, which does not exist"
    top_level = {p for p in packages() if p.count("/") <= 1} - {"harness"}  # harness/ is its folders and cli.py
    for package in top_level:
        assert package in ROWS, f"{package}/ is a package that ARCHITECTURE.md's table does not list"


def test_impls_subpackages_mirror_the_registry_roles() -> None:
    subpackages = {p.replace("/", ".") for p in packages() if p.startswith("impls/")}
    assert subpackages == {"impls.core", *registry.ROLE_PACKAGES.values()}
    for rec in registry.RECORDS:
        module = rec.target.partition(":")[0]
        assert module.rpartition(".")[0] == registry.ROLE_PACKAGES[rec.role], (
            f"{rec.name} (role {rec.role}) lives in {module}, not in {registry.ROLE_PACKAGES[rec.role]}")
    targets = {rec.target.partition(":")[0] for rec in registry.RECORDS}
    for package in set(registry.ROLE_PACKAGES.values()):
        for path in (ROOT / package.replace(".", "/")).glob("*.py"):
            module = f"{package}.{path.stem}"
            if path.stem != "__init__":
                assert module in targets or module in registry.SUPPORT_MODULES, (
                    f"{module} is neither a registered implementation nor a support module of the registry")


def test_impls_top_level_stays_small() -> None:
    modules = [p.name for p in (ROOT / "impls").glob("*.py")]
    assert len(modules) <= 6, modules


def imports_of(path: Path) -> set[str]:
    """Every absolute module a file imports (at any depth of the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def module_files() -> list[tuple[str, Path]]:
    return [(owner(path.parent.relative_to(ROOT).as_posix()), path)
            for top in ("impls", "harness", "scenarios") for path in (ROOT / top).rglob("*.py")]


@pytest.mark.parametrize("folder", sorted(ROWS))
def test_no_module_imports_what_its_folder_does_not(folder: str) -> None:
    forbidden = ROWS[folder]
    files = [path for path in (ROOT / folder).rglob("*.py")]
    for path in files:
        for name in imports_of(path):
            bad = [f for f in forbidden if name == f or name.startswith(f + ".")]
            assert not bad, f"{path.relative_to(ROOT)} imports {name}: ARCHITECTURE.md says {folder}/ does not"


def test_the_layout_page_names_every_folder_of_the_table() -> None:
    layout = LAYOUT.split("# Repository layout", 1)[1]
    for folder in ROWS:
        assert f"{folder}/" in layout, f"docs/layout.md does not name {folder}/"


def test_every_harness_module_with_compiled_code_keys_the_numba_cache() -> None:
    compiled = {path.relative_to(ROOT / "harness").as_posix() for path in (ROOT / "harness").rglob("*.py")
                if re.search(r"^\s*(@njit|@intrinsic|\w+ = njit\()", path.read_text(), re.M)
                or "njit(" in path.read_text()}
    assert compiled == set(harness.COMPILED_MODULES)
