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


# -- the harness's floors ---------------------------------------------------------------------------------------
HARNESS = ROOT / "harness"


def floor_table(text: str = ARCHITECTURE) -> dict[str, int]:
    """ARCHITECTURE.md's floors table: a folder (``harness/base``) or a module file -> its floor."""
    floors = {}
    for line in text.split("## The harness in floors", 1)[-1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].isdigit():
            for path in re.findall(r"`([\w/.]+)`", cells[1]):
                floors[path.rstrip("/")] = int(cells[0])
    return floors


FLOORS = floor_table()


def harness_modules() -> dict[str, Path]:
    """Every module of ``harness/`` by its dotted name (a package by its own name)."""
    found = {}
    for path in HARNESS.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = harness_modules()


def place(module: str, floors: dict[str, int] = FLOORS) -> tuple[int, str] | None:
    """(floor, package) of a harness module: the table's longest entry holding its file; None if none does."""
    path = MODULES[module].relative_to(ROOT).as_posix()
    entries = [e for e in floors if path == e or path.startswith(e + "/")]
    if not entries:
        return None
    entry = max(entries, key=len)
    return floors[entry], entry


def imported_modules(source: str, module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` (the text of ``module``) imports, at any depth: ``from a import b``
    counts ``a.b`` where that is a module, else ``a``; relative imports are resolved."""
    package = module if module in known and MODULES.get(module, Path()).name == "__init__.py" \
        else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


GRAPH = {m: imported_modules(p.read_text(), m, set(MODULES)) for m, p in MODULES.items()}


def upward_imports(graph: dict[str, set[str]], where) -> list[str]:
    """Every import of ``graph`` that runs up a floor, or sideways into another package of the same floor."""
    bad = []
    for module, targets in sorted(graph.items()):
        floor, package = where(module)
        for target in sorted(targets):
            to_floor, to_package = where(target)
            if to_floor > floor or (to_floor == floor and to_package != package):
                bad.append(f"{module} (floor {floor}) imports {target} (floor {to_floor})")
    return bad


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each group of modules that import one another, through others or not."""
    reach = {node: reachable(graph, node) for node in graph}
    found = {tuple(sorted({node} | {m for m in reach[node] if node in reach.get(m, ())}))
             for node in graph if node in reach[node]}
    return sorted(list(group) for group in found)


def test_the_floors_table_places_every_harness_module_and_names_only_what_exists() -> None:
    assert FLOORS, "ARCHITECTURE.md has no floors table"
    for entry in FLOORS:
        assert (ROOT / entry).exists(), f"ARCHITECTURE.md's floors name {entry}, which does not exist"
    unplaced = [m for m in MODULES if place(m) is None]
    assert not unplaced, f"modules on no floor of ARCHITECTURE.md: {unplaced}"
    assert "harness.measure" not in MODULES


def test_no_harness_import_runs_up_a_floor() -> None:
    bad = upward_imports(GRAPH, place)
    assert not bad, "imports against ARCHITECTURE.md's floors:\n" + "\n".join(bad)


def test_no_import_circle_between_harness_modules() -> None:
    found = circles(GRAPH)
    assert not found, f"import circles: {found}"


def test_the_checks_see_function_local_imports_and_circles() -> None:
    """The checks themselves: a function-local import up a floor and a circle through it are both found."""
    source = "from harness.base import replay\n\ndef late():\n    from harness.cli import main\n"
    graph = {"harness.base.stats": imported_modules(source, "harness.base.stats", set(MODULES)),
             "harness.cli": {"harness.base.stats"}}
    assert graph["harness.base.stats"] == {"harness.base.replay", "harness.cli"}
    bad = upward_imports(graph, place)
    assert bad == ["harness.base.stats (floor 1) imports harness.cli (floor 8)"]
    assert circles(graph) == [["harness.base.stats", "harness.cli"]]


def test_file_plumbing_stands_below_everything_of_the_project() -> None:
    """``scenarios/files/`` (atomic writes, the non-regular-file rule) imports nothing of the project, relative
    imports included, so that ``scenarios`` and ``harness`` alike can stand on it."""
    modules = sorted((ROOT / "scenarios" / "files").glob("*.py"))
    assert {p.name for p in modules} >= {"__init__.py", "atomic.py", "kinds.py"}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                names = [] if node.level == 1 else [f"{'.' * node.level}{node.module or ''}"]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            bad = [n for n in names if n.startswith(".") or n.split(".")[0] in ("impls", "harness", "scenarios")]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}: file plumbing stands on nothing of the project"


# -- one room per idea ------------------------------------------------------------------------------------------
def code_modules() -> list[Path]:
    """Every module of the code's folders but the packages' ``__init__.py``."""
    return [p for top in ("impls", "harness", "scenarios") for p in (ROOT / top).rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts]


def test_no_two_modules_share_a_basename() -> None:
    by_name: dict[str, list[str]] = {}
    for path in code_modules():
        by_name.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    repeated = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not repeated, f"modules sharing a basename (give each its own name): {repeated}"


def test_no_folder_outside_impls_keeps_three_modules_of_one_name_prefix() -> None:
    """A name prefix shared by three modules is a folder's job (``history_*.py`` -> ``history/``)."""
    by_prefix: dict[tuple[str, str], list[str]] = {}
    for path in code_modules():
        folder = path.parent.relative_to(ROOT).as_posix()
        if folder.split("/")[0] != "impls":
            by_prefix.setdefault((folder, path.stem.split("_")[0]), []).append(path.name)
    crowded = {f"{folder}/{prefix}_*": names for (folder, prefix), names in by_prefix.items() if len(names) >= 3}
    assert not crowded, f"name prefixes doing a folder's job: {crowded}"


def test_the_layout_page_names_exactly_the_tree_s_folders() -> None:
    """docs/layout.md (the README's layout table) names every package folder and no folder that is gone."""
    layout = LAYOUT.split("# Repository layout", 1)[1]
    named = {n.rstrip("/") for n in re.findall(r"^((?:impls|harness|scenarios)/[\w/.]*)\s", layout, re.M)}
    tree = {p for p in packages() if p.count("/") <= 1} - {"harness"}
    assert named - tree <= {"harness/cli.py"} and not {n for n in named if not (ROOT / n).exists()}, named - tree
    assert tree <= named, f"folders the layout page does not name: {sorted(tree - named)}"


def parameter_counts(path: Path) -> dict[str, int]:
    """Every function of a module (methods and nested ones too) -> how many parameters it takes."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            out[f"{node.name}:{node.lineno}"] = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                                                 + bool(a.vararg) + bool(a.kwarg))
    return out


@pytest.mark.parametrize("module", ["harness/run/runner.py", "harness/run/jobs.py", "harness/run/cells.py",
                                    "harness/base/interleave.py", "harness/studies/paced_study.py"])
def test_a_run_s_settings_travel_as_records_not_long_argument_lists(module: str) -> None:
    """What travels together goes in one record: the main process's (``Shared``, ``ScenarioTrace``, ``Timed``,
    ``ScenarioJob``), a worker's (``CellSetup``, ``Repetitions``, ``Turns``, ``Hooks``, ``PacedCells``)."""
    long = {name: n for name, n in parameter_counts(ROOT / module).items() if n > 5}
    assert not long, f"{module}: functions of more than 5 parameters: {long}"
