"""What the docs promise about the tree and the command line holds: every reference to a file, a heading ("see X",
"its README", ``docs/x.md#anchor`` in code), every ``make`` target, subcommand and flag they name exists, and
no default or exit status is typed by hand (each is a fact rendered from the parser or the code's constant:
tests/test_docs_facts.py). Each check has a test that plants the defect and sees it caught."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from harness.output import sections
from tests.test_docs import anchors, planted, slug
from tests.test_docs_facts import PROSE_PAGES, prose

ROOT = Path(__file__).resolve().parents[1]
PAGES = sections.pages(ROOT)
IDS = [p.relative_to(ROOT).as_posix() for p in PAGES]


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in out if re.search(r"(\.(py|md|sh|toml|yml|txt)|Makefile|\.ci/run)$", f)
            and (ROOT / f).is_file()]


# -- references to headings and anchors -------------------------------------------------------------------------
ANCHOR = re.compile(r"((?:\.\./|[\w-]+/)*[\w-]+\.md)#([a-z0-9_-]+)")
QUOTED = re.compile(r"\b((?:docs/)?[\w-]+\.md|README|ARCHITECTURE)(?:,|'s)? \"([^\"\n]{3,60})\"")


def _doc(name: str, near: Path) -> Path:
    """The page a reference names: a bare README or ARCHITECTURE is the repository's; a file name is looked for
    beside the referring file, then at the root, then in docs/."""
    if name in ("README", "ARCHITECTURE"):
        return ROOT / f"{name}.md"
    for candidate in (near.parent / name, ROOT / name, ROOT / "docs" / name):
        if candidate.is_file():
            return candidate
    return ROOT / name


def leads(text: str) -> set[str]:
    """Every heading's text and every bold lead (``**Threshold**``, ``**One host thread.**``), plain."""
    found = {m.group(1) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}
    found |= {m.group(1).rstrip(".:") for m in re.finditer(r"\*\*([^*\n]+)\*\*", text)}
    return {re.sub(r"[`*]", "", f).strip() for f in found}


def broken_references(path: Path) -> list[str]:
    """``file.md#anchor`` and ``FILE, "Heading"`` references of ``path`` to a file or heading that is not there."""
    text, out = path.read_text(encoding="utf-8", errors="replace"), []
    for m in ANCHOR.finditer(text):
        doc = _doc(m.group(1), path)
        if doc.is_file() and m.group(2) not in anchors(doc.read_text(encoding="utf-8")):
            out.append(f"{m.group(0)}: no such heading")
    for m in QUOTED.finditer(text):
        doc = _doc(m.group(1), path)
        if doc.is_file() and m.group(2) not in leads(doc.read_text(encoding="utf-8")):
            out.append(f'{m.group(1)} "{m.group(2)}": no such heading or bold lead')
    return out


@pytest.mark.parametrize("path", _tracked(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_reference_to_a_heading_resolves(path: Path) -> None:
    if path.name.startswith("test_docs"):
        pytest.skip("the tests of these checks plant broken references")
    assert broken_references(path) == []


def test_a_stale_heading_reference_is_caught(tmp_path: Path) -> None:
    page = planted(tmp_path, {"README.md": "# Title\n\n## Benchmarks in CI\n\n**Cost** (x)\n", "notes.md": (
        'README, "Benchmarks in CI"; README\'s "Cost"; README, "Time budget"; README.md#title; README.md#gone\n')})
    assert sorted(broken_references(page)) == ['README "Time budget": no such heading or bold lead',
                                               "README.md#gone: no such heading"]


# -- paths the pages name ---------------------------------------------------------------------------------------
PATH = re.compile(r"`((?:\.ci|benchmarks|docs|examples|harness|impls|notebooks|results|scenarios|scripts|tests)"
                  r"/[\w./-]*)`")


def missing_paths(page: Path, root: Path = ROOT) -> list[str]:
    """Repository paths in code spans of ``page`` (``harness/...``, ``results/x/``) that the tree does not have;
    a path with a placeholder (``<run-id>``, ``*``) is a pattern, not a path."""
    out = []
    for m in PATH.finditer(page.read_text(encoding="utf-8")):
        rel = m.group(1).split(":")[0]
        module = f"{rel.rsplit('.', 1)[0]}.py"  # harness/base/rows.Row: a module's attribute
        if not re.search(r"[<*{]", rel) and not any((base / p).exists() for base in (root, page.parent)
                                                    for p in (rel, module)):
            out.append(rel)
    return out


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_path_a_page_names_exists(page: Path) -> None:
    allowed = {"results/bench-ci-latest", "results/latest", "results/.trace-cache/", "build/ci-compare/comment.md"}
    assert [p for p in missing_paths(page) if p not in allowed and not p.startswith(("build/", "results/20"))] == []


def its_readme(page: Path) -> list[str]:
    """A bullet that names a folder (``- `mutation/`: ... its README``) and points at its README, without one."""
    out = []
    for m in re.finditer(r"^- `([\w.-]+/)`[^\n]*(?:\n  [^\n]*)*", page.read_text(encoding="utf-8"), re.M):
        if re.search(r"\bits README\b", m.group(0)) and not (page.parent / m.group(1) / "README.md").is_file():
            out.append(m.group(1))
    return out


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_its_readme_exists(page: Path) -> None:
    assert its_readme(page) == []


def test_a_missing_readme_or_path_is_caught(tmp_path: Path) -> None:
    (tmp_path / "gone").mkdir()
    page = planted(tmp_path, {"kept/README.md": "x", "README.md": (
        "- `kept/`: see its README.\n- `gone/`: what it holds\n  (see its README).\n"
        "`harness/cli.py` `harness/nothing.py` `results/<run-id>/`\n")})
    assert its_readme(page) == ["gone/"]
    assert missing_paths(page, ROOT) == ["harness/nothing.py"]


# -- make targets, subcommands, flags ---------------------------------------------------------------------------
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from harness.cli import build_parser

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUBCOMMANDS = _subparsers()
OWN_FLAGS = {f for p in SUBCOMMANDS.values() for a in p._actions for f in a.option_strings}
SCRIPT_FLAGS = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", "".join(  # the scripts' and helper scripts'
    p.read_text() for folder in ("scripts", "harness") for p in (ROOT / folder).rglob("*.py"))))
# Flags of other tools the pages show: pip, git, gh, pytest, the compiler, make's own variables.
OTHER_FLAGS = {"--no-deps", "--find-links", "--index-url", "--edit-last", "--body-file", "--show-toplevel",
               "--name-only", "--noprofile", "--norc", "--no-install-recommends", "--durations", "--quiet",
               "--disable-pip-version-check", "--no-color", "--only-binary", "--pull-request", "--tool",
               "--trace-children", "--dump-instr", "--cache-sim", "--collect-atstart", "--toggle-collect",
               "--create-if-none", "--shared", "--bare", "--depth", "--soft", "--benchmark-compare-fail",
               "--control", "--delay", "--no-index",
               "--check", "--flag"}  # python -m harness.facts --check; docs/output.md's placeholder


def unknown_commands(text: str) -> list[str]:
    """``kvblock-bench SUB``, ``kvblock-bench SUB ... --flag`` (one code span) and ``make TARGET`` that do not exist."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for m in re.finditer(r"\bkvblock-bench ([a-z][\w-]*)", span):
            if m.group(1) not in SUBCOMMANDS:
                out.append(f"kvblock-bench {m.group(1)}")
                continue
            options = SUBCOMMANDS[m.group(1)]._option_string_actions
            out += [f"kvblock-bench {m.group(1)} {f}" for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)",
                                                                        span[m.end():]) if f not in options]
        out += [f"make {t}" for t in re.findall(r"^make ([a-z][\w-]*)", span) if t not in targets]
    return out


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_command_a_page_names_exists(page: Path) -> None:
    assert unknown_commands(page.read_text(encoding="utf-8")) == []


def unknown_flags(text: str) -> list[str]:
    """Every ``--flag`` in a code span that no kvblock-bench subcommand, script or named other tool has."""
    flags = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(re.findall(r"`([^`\n]+)`", text)))
    return sorted({f for f in flags if f not in OWN_FLAGS | SCRIPT_FLAGS | OTHER_FLAGS})


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_flag_a_page_names_exists(page: Path) -> None:
    assert unknown_flags(page.read_text(encoding="utf-8")) == []


def test_a_stale_command_or_flag_is_caught() -> None:
    text = ("`kvblock-bench ab HEAD --reps 3` `kvblock-bench frobnicate` `kvblock-bench run --no-such` "
            "`make bench` `make nothing` `--gone-flag`")
    assert unknown_commands(text) == ["kvblock-bench frobnicate", "kvblock-bench run --no-such", "make nothing"]
    assert unknown_flags(text) == ["--gone-flag", "--no-such"]


# -- defaults and exit statuses are facts -----------------------------------------------------------------------
HAND_TYPED = re.compile(r"\bexit(?:s| status(?:es)?| code)?(?: is| of| with|:)? ([1-9]\d*)\b"
                        r"|(--[a-z][\w-]*`?[^.;\n]{0,25}?\bdefault:? \d[\d.,]*)")


def hand_typed_claims(text: str) -> list[str]:
    """Exit statuses (but 0) and flag defaults written into prose by hand rather than rendered as facts."""
    return [m.group(0) for m in HAND_TYPED.finditer(prose(text, code_spans=True))]


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_default_or_exit_status_is_typed_by_hand(page: Path) -> None:
    assert hand_typed_claims(page.read_text(encoding="utf-8")) == [], (
        "render it as a fact (harness/facts.py: default:COMMAND:--flag, exit.NAME)")


def test_a_hand_typed_default_or_exit_status_is_caught() -> None:
    text = ("Bad input ends with exit status 2. `--deadline` (default 300). exit status "
            "<!-- fact:exit.usage -->2<!-- /fact -->; "
            "`--reps` (default <!-- fact:default:run:--reps -->3<!-- /fact -->); "
            "exit status 0 when it passes.")
    assert hand_typed_claims(text) == ["exit status 2", "--deadline` (default 300"]


def test_slug_is_the_one_test_docs_uses() -> None:
    assert slug("`make bench-ci`, `make bench-compare`: x") == "make-bench-ci-make-bench-compare-x"
