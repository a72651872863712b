"""``kvblock-bench ab`` measures exactly the trees it names: each version's modules come from its own tree, never from
the working tree, another checkout or a copy on PYTHONPATH (or it refuses, in one line); a version whose code does not
import, or exits at import, is refused naming the ref and the reason; a run whose implementations all come from
outside the refs is refused; outside a checkout of kvblock-bench the runs go to a cache folder. Small throwaway git
repositories (tmp_path) stand in for a user's repository of plug-ins and for another checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.base import coderoot
from harness.ci import ab
from harness.cli import main
from harness.errors import InputError
from harness.run.jobs import ImplInfo, ProbeJob, execute
from harness.run.versions import Side, check_from_refs, resolve_side
from harness.run.workers import CodeUnloadable, Pool, Worker

ROOT = Path(__file__).resolve().parents[1]
CODEROOT = Path(coderoot.__file__)
TINY = ["--quick", "--scenario", "paper", "--regime", "batched", "--no-progress", "--no-counts"]
PLUGIN = "class Mine:\n    WHERE = {where!r}\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def plugin_repo(tmp_path: Path, name: str = "mine") -> Path:
    """A user's repository holding one plug-in package, ``mypkg``, committed."""
    repo = tmp_path / name
    (repo / "mypkg").mkdir(parents=True)
    (repo / "mypkg" / "__init__.py").write_text("")
    (repo / "mypkg" / "bm.py").write_text(PLUGIN.format(where="HEAD"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the plug-in")
    return repo


def run_ab(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["ab", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("kvblock-bench: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- the main process: refused before anything is checked out --------------------------------------------------
def test_a_checkout_of_kvblock_bench_measured_with_another_checkouts_harness_is_refused(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Running one checkout's kvblock-bench inside another checkout (or with a PYTHONPATH naming another): NEW's
    harness and designs would not be the tree named. Exit 2, one line, no worktree made."""
    other = tmp_path / "other"
    for part in ("harness/base/coderoot.py", "impls/registry.py"):
        (other / part).parent.mkdir(parents=True, exist_ok=True)
        (other / part).write_text("")
    git(other, "init", "-q")
    git(other, "add", "-A")
    git(other, "commit", "-qm", "another checkout")
    monkeypatch.chdir(other)
    status, out, err = run_ab(capsys, "HEAD", *TINY, "--results", str(tmp_path / "r"))
    assert status == 2 and not out
    assert f"this kvblock-bench runs from {ROOT}, not from {other.resolve()}" in one_line(err)
    assert "kvblock-bench-ab-" not in git(other, "worktree", "list") and not list((tmp_path / "r").glob("*-ab-*"))


def test_a_module_of_the_repository_that_this_python_imports_from_elsewhere_is_refused(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stray copy of the plug-in's package earlier on the path (PYTHONPATH, another checkout): ab would measure it
    instead of the refs; refused in one line naming where it comes from."""
    repo = plugin_repo(tmp_path)
    stray = tmp_path / "elsewhere"
    (stray / "mypkg").mkdir(parents=True)
    (stray / "mypkg" / "__init__.py").write_text("")
    monkeypatch.chdir(repo)
    monkeypatch.syspath_prepend(str(stray))
    status, _, err = run_ab(capsys, "HEAD", "--impl", "mypkg.bm:Mine", *TINY, "--results", str(tmp_path / "r"))
    line = one_line(err)
    assert status == 2 and f"module mypkg: this Python imports it from {stray.resolve() / 'mypkg'}" in line
    assert "kvblock-bench-ab-" not in git(repo, "worktree", "list")


# -- a process of one version: its modules from its tree, never from elsewhere ------------------------------------
def _in_version(tmp_path: Path, root: Path, repo: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python after ``coderoot.enter(root, repo)`` (coderoot loaded from its file alone)."""
    script = tmp_path / "probe.py"
    script.write_text("import importlib.util, sys\n"
                      f"spec = importlib.util.spec_from_file_location('coderoot', {str(CODEROOT)!r})\n"
                      "coderoot = sys.modules['coderoot'] = importlib.util.module_from_spec(spec)\n"
                      "spec.loader.exec_module(coderoot)\n"
                      f"coderoot.enter({str(root)!r}, {str(repo)!r})\n" + code)
    return subprocess.run([sys.executable, str(script)], cwd=repo, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": ""}, timeout=120)


def test_a_version_imports_the_repositorys_modules_from_its_own_tree_whatever_the_path_says(tmp_path: Path) -> None:
    """The working tree and a stray copy both on the path: the version's process imports its own tree's."""
    repo = plugin_repo(tmp_path)
    root = tmp_path / "base"
    shutil.copytree(repo / "mypkg", root / "mypkg")
    (root / "mypkg" / "bm.py").write_text(PLUGIN.format(where="BASE"))
    stray = tmp_path / "stray"
    (stray / "mypkg").mkdir(parents=True)
    (stray / "mypkg" / "__init__.py").write_text("WHERE = 'stray'\n")
    proc = _in_version(tmp_path, root, repo, f"sys.path[:0] = [{str(stray)!r}, {str(repo)!r}]\n"
                       "import mypkg.bm\nprint(mypkg.bm.Mine.WHERE, coderoot.audit() or 'clean')\n")
    assert proc.stdout.split() == ["BASE", "clean"], proc.stderr


def test_a_module_this_version_lacks_is_not_taken_from_another_tree(tmp_path: Path) -> None:
    """A module the repository holds that the version does not (a plug-in NEW added): ModuleNotFoundError, never
    the working tree's copy; a submodule the version lacks likewise."""
    repo = plugin_repo(tmp_path)
    (repo / "mypkg" / "extra.py").write_text("X = 1\n")
    root = tmp_path / "base"
    root.mkdir()
    proc = _in_version(tmp_path, root, repo, f"sys.path.insert(0, {str(repo)!r})\n"
                       "try:\n    import mypkg\nexcept ModuleNotFoundError as e:\n    print('absent', e.name)\n")
    assert proc.stdout.split() == ["absent", "mypkg"], proc.stderr
    shutil.copytree(repo / "mypkg", root / "mypkg", ignore=shutil.ignore_patterns("extra.py"))
    proc = _in_version(tmp_path, root, repo, f"sys.path.insert(0, {str(repo)!r})\n"
                       "try:\n    import mypkg.extra\nexcept ModuleNotFoundError as e:\n    print('absent', e.name)\n")
    assert proc.stdout.split() == ["absent", "mypkg.extra"], proc.stderr


def test_the_audit_names_a_module_that_came_from_elsewhere(tmp_path: Path) -> None:
    """Whatever slips past the finder (code that loads a file by its path) is named by the audit after each job:
    a module the repository holds, loaded from the working tree or from a stray copy, in a process of BASE."""
    repo = plugin_repo(tmp_path)
    root = tmp_path / "base"
    shutil.copytree(repo / "mypkg", root / "mypkg")
    stray = tmp_path / "stray.py"
    stray.write_text(PLUGIN.format(where="stray"))
    for where in (repo / "mypkg" / "bm.py", stray):
        proc = _in_version(tmp_path, root, repo, (
            "import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('mypkg.bm', {str(where)!r})\n"
            "module = sys.modules['mypkg.bm'] = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(module)\nprint(coderoot.audit())\n"))
        assert f"module mypkg.bm was imported from {where}" in proc.stdout, proc.stderr
        assert f"not from {root}" in proc.stdout


def test_in_a_repository_of_plug_ins_kvblock_bench_comes_from_the_installed_harness(tmp_path: Path) -> None:
    """The user's repository holds a folder named like ours (scenarios/, with an __init__.py): the version still
    imports kvblock-bench's own packages from the installed harness."""
    repo = plugin_repo(tmp_path)
    (repo / "scenarios").mkdir()
    (repo / "scenarios" / "__init__.py").write_text("MINE = True\n")
    root = tmp_path / "base"
    shutil.copytree(repo, root, ignore=shutil.ignore_patterns(".git"))
    proc = _in_version(tmp_path, root, repo, f"sys.path.insert(0, {str(ROOT)!r})\nimport scenarios\n"
                       "print(scenarios.__file__)\n")
    assert Path(proc.stdout.strip()) == ROOT / "scenarios" / "__init__.py", proc.stderr


def test_held_names_are_the_repositorys_packages_and_modules_not_the_standard_librarys(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for folder in ("pkg", "src/inner", "docs", ".venv/lib/python3/site-packages/dep"):
        (repo / folder).mkdir(parents=True)
    for file in ("pkg/__init__.py", "src/inner/__init__.py", "tool.py", "types.py", "setup-x.py",
                 ".venv/lib/python3/site-packages/dep/__init__.py"):
        (repo / file).write_text("")
    names = coderoot.held(repo, [str(repo / "src"), str(repo / ".venv/lib/python3/site-packages"), "/usr/lib"])
    assert names == {"pkg": repo, "tool": repo, "inner": repo / "src"}


# -- versions that do not import, or that measure nothing of the refs --------------------------------------------
def _version_of_this_checkout(root: Path) -> Path:
    for name in ("harness", "impls", "scenarios"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    return root


@pytest.mark.parametrize(("line", "reason"), [
    ("raise SystemExit(3)", "SystemExit: 3 (impls/__init__.py:"),
    ("raise RuntimeError('broken at import')", "RuntimeError: broken at import (impls/__init__.py:"),
    ("import no_such_module_anywhere", "ModuleNotFoundError: No module named 'no_such_module_anywhere'"),
])
def test_a_version_whose_code_does_not_import_says_why_in_one_line(tmp_path: Path, line: str, reason: str) -> None:
    """A worker of a version whose package raises or exits at import: CodeUnloadable (exit 2 from ab) with the
    reason and the line it reached; the worker is gone, no traceback printed."""
    root = _version_of_this_checkout(tmp_path / "root")
    with (root / "impls" / "__init__.py").open("a") as source:
        source.write(f"\n{line}\n")
    worker = Worker(execute, 60, str(root))
    try:
        with pytest.raises(CodeUnloadable, match=reason.replace("(", r"\(").replace(")", r"\)")) as raised:
            worker.run(ProbeJob("dict"))
    finally:
        worker.stop()
    assert "\n" not in str(raised.value)


def test_a_registered_design_that_raises_at_import_refuses_its_side_naming_the_ref(tmp_path: Path) -> None:
    """Loading a version's registry where one design raises at import: one line naming the side, ref, commit,
    design and reason (before, the registry's traceback and exit 1)."""
    root = _version_of_this_checkout(tmp_path / "root")
    with (root / "impls" / "designs" / "list_design.py").open("a") as source:
        source.write("\nraise RuntimeError('list is broken here')\n")
    side = Side("BASE", str(root), "HEAD~1", "0123456789ab")
    with Pool(1, execute, 300) as pool, pytest.raises(InputError) as raised:
        resolve_side(pool, side, ["dict", "list"])
    text = str(raised.value)
    assert text.startswith("BASE (HEAD~1, commit 0123456789ab): implementation 'list' could not be imported: "
                           "RuntimeError: list is broken here") and "list_design.py:" in text


def test_no_implementation_from_the_refs_is_refused() -> None:
    """Registered designs of the installed harness on both sides of a repository of plug-ins: the same code twice,
    refused; one implementation of the refs is enough."""
    base, new = Side("BASE", "/tmp/base", "HEAD", "a"), Side("NEW", "/work/repo", "working tree", "b")
    for side in (base, new):
        side.infos["flat"] = ImplInfo("flat", True, source=str(ROOT / "impls" / "designs" / "flat.py"))
    with pytest.raises(InputError, match="no implementation measured comes from the refs compared: flat"):
        check_from_refs([base, new])
    new.infos["mypkg.bm:Mine"] = ImplInfo("mypkg.bm:Mine", True, source="/work/repo/mypkg/bm.py")
    check_from_refs([base, new])
    assert ab.origin_words(new, own=False).startswith("NEW: mypkg.bm:Mine from /work/repo (the working tree at b); "
                                                      "the harness and flat from the installed kvblock-bench")


# -- where the runs go ------------------------------------------------------------------------------------------
def test_outside_a_checkout_of_kvblock_bench_the_runs_go_to_a_cache_folder(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    repo = plugin_repo(tmp_path, "my-plugins")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert ab.results_root(repo) == tmp_path / "cache" / "kvblock-bench" / "ab" / "my-plugins"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ab.results_root(repo) == tmp_path / "home" / ".cache" / "kvblock-bench" / "ab" / "my-plugins"
    assert ab.results_root(ROOT) == ROOT / "results"


def test_ab_says_where_the_runs_go_and_leaves_the_repository_clean(tmp_path: Path, capsys,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused later for lack of a design of the refs, ab has said where its runs go and made no results/ folder
    in the user's repository."""
    repo = plugin_repo(tmp_path)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    def stop(opts, argv=None):
        raise InputError("stopped before checking anything out")

    monkeypatch.setattr(ab, "run", stop)
    status, _, err = run_ab(capsys, "HEAD", *TINY)
    assert status == 2 and f"ab: the runs go to {tmp_path / 'cache' / 'kvblock-bench' / 'ab' / 'mine'}" in err
    assert not (repo / "results").exists() and git(repo, "status", "--porcelain") == ""

