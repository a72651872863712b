"""A figure in the docs' prose is a fact rendered from the committed file or the code constant it comes from
(harness/facts.py), or lives in a generated section: every fact holds, and no figure is typed by hand
outside them unless its sentence says when it was measured (a date or a commit: a quote of history, which does not
go stale). Each check has a test that plants a stale figure and sees it caught."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from harness import facts
from harness.output import sections

ROOT = Path(__file__).resolve().parents[1]
PAGES = sections.pages(ROOT)
IDS = [p.relative_to(ROOT).as_posix() for p in PAGES]
# The pages whose prose the figure rule holds (results/<folder>/README.md are each folder's measurement notes).
PROSE_PAGES = [p for p in PAGES if not re.match(r"results/[^/]+/README\.md$", p.relative_to(ROOT).as_posix())]
SECTION = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.S)
FIGURE = re.compile(r"(?<![\w.\-/#\[])\d[\d,]*(?:\.\d+)?(?:\s?(?:-|–|to)\s?-?\d[\d,]*(?:\.\d+)?)?\s?"
                    r"(?:ns|us|µs|ms|s|min|%|x|×)(?!\w)|\[\d[\d.,]*\s?[-–]\s?\d[\d.,]*\]")
# A sentence that says when its figures were measured: a date, a commit, git's history.
STAMP = re.compile(r"\b20\d\d-\d\d-\d\d\b|`[0-9a-f]{7,12}`|\bgit (?:show|history|log)\b|\bat [0-9a-f]{7,12}\b")
CODE_SPAN = re.compile(r"`[^`\n]*`")
CONFIDENCE = "95 %"  # the intervals' level, harness.base.stats.CONFIDENCE (held below)


def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group(0))


def prose(text: str, code_spans: bool = False) -> str:
    """``text`` with generated sections, code blocks, facts and (unless ``code_spans``) code spans blanked out, line
    numbers kept."""
    for pattern in (SECTION, re.compile(r"```.*?```", re.S), facts.FACT, *([] if code_spans else [CODE_SPAN])):
        text = pattern.sub(_blank, text)
    return text


def _sentence(text: str, start: int, end: int) -> str:
    before = max(text.rfind(". ", 0, start), text.rfind("\n\n", 0, start), text.rfind("\n- ", 0, start))
    after = [i for i in (text.find(". ", end), text.find("\n\n", end)) if i >= 0]
    return text[before:min(after or [len(text)])]


def hand_typed(text: str) -> list[str]:
    """``line: figure`` for each measured-looking figure of ``text``'s prose that is neither a fact nor in a
    generated section, and whose sentence does not say when it was measured."""
    plain, out = prose(text), []
    for m in FIGURE.finditer(plain):
        if m.group(0).strip() == CONFIDENCE or STAMP.search(_sentence(text, m.start(), m.end())):
            continue
        out.append(f"{plain.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    return out


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_figure_is_typed_by_hand(page: Path) -> None:
    assert hand_typed(page.read_text(encoding="utf-8")) == [], (
        f"{page.relative_to(ROOT)}: render the figure from its file or constant (harness/facts.py), or say "
        "when it was measured (a date or a commit) if it is history")


def test_a_hand_typed_figure_is_caught_and_a_stamped_one_is_not() -> None:
    text = ("Hot, 2.1-3.3 us per step; the A/A control reads [0.87-1.12].\n\nOn 2026-12-04 it read 3.02 ns. "
            "At `dbca01e` 4.13 ns. A fact: <!-- fact:ref.aa -->1.01×<!-- /fact -->. `--threshold 10 %`. "
            "95 % interval.\n"
            "<!-- results:begin -->\n3.3 ns\n<!-- results:end -->\n```\n7 ns\n```\n")
    assert hand_typed(text) == ["1: 2.1-3.3 us", "1: [0.87-1.12]"]


def test_the_confidence_level_the_pages_quote_is_the_codes() -> None:
    from harness.base.stats import CONFIDENCE as level

    assert f"{level * 100:g} %" == CONFIDENCE


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_fact_holds(page: Path) -> None:
    assert facts.stale(page, ROOT) == [], "run python -m harness.facts"


def test_every_fact_is_quoted_somewhere() -> None:
    used = {m.group(1) for page in PAGES for m in facts.FACT.finditer(page.read_text(encoding="utf-8"))}
    assert sorted(set(facts.FACTS) - used) == []


def test_an_unknown_fact_is_refused() -> None:
    with pytest.raises(facts.FactError, match="no fact named 'nothing'"):
        facts.render("<!-- fact:nothing -->x<!-- /fact -->")
    with pytest.raises(facts.FactError, match="kvblock-bench run has no option --nothing"):
        facts.lookup("default:run:--nothing").render(ROOT)


def test_a_planted_stale_figure_is_caught(tmp_path: Path) -> None:
    """A page whose fact says what its source no longer does, and a source changed under a page: both reported."""
    page = tmp_path / "docs" / "method.md"
    page.parent.mkdir()
    shutil.copy(ROOT / "docs" / "method.md", page)
    (tmp_path / "results" / "paced_floor").mkdir(parents=True)
    shutil.copytree(ROOT / "results" / "reference", tmp_path / "results" / "reference",
                    ignore=shutil.ignore_patterns("raw", "figures"))
    shutil.copytree(ROOT / "results" / "processes", tmp_path / "results" / "processes")
    floor = (ROOT / "results" / "paced_floor" / "paced_floor.txt").read_text()
    (tmp_path / "results" / "paced_floor" / "paced_floor.txt").write_text(floor)
    assert facts.stale(page, tmp_path) == []
    page.write_text(page.read_text().replace("-->9<!--", "-->5<!--", 1))
    floor_file = tmp_path / "results" / "paced_floor" / "paced_floor.txt"
    floor_file.write_text(floor.replace("hot    3.3 us", "hot    3.9 us"))
    problems = facts.stale(page, tmp_path)
    assert any("fact paced.reps reads '5'" in p and "gives '9'" in p for p in problems), problems
    assert any("fact paced-floor.step.hot reads '2.6-3.3 us'" in p and "gives '2.6-3.9 us'" in p
               for p in problems), problems


def test_rendering_rewrites_only_the_facts() -> None:
    text = "before <!-- fact:ab.reps -->99<!-- /fact --> after"
    assert facts.render(text, ROOT) == "before <!-- fact:ab.reps -->8<!-- /fact --> after".replace(
        "8", facts.lookup("ab.reps").render(ROOT))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "lmdeploy", "tvm"])
def test_the_history_sections_are_what_their_folders_say(engine: str) -> None:
    """The README's engine histories, regenerated from the committed folders (``report DIR --history-readme``)."""
    from harness.history.readme_section import markers, section

    begin, end = markers(engine)
    text = sections.doc_path(f"history-{engine}", ROOT).read_text(encoding="utf-8")
    assert section(ROOT / "results" / "history" / engine, f"results/history/{engine}")[1] == text.split(
        begin, 1)[1].split(end, 1)[0].strip("\n"), (
        f"run kvblock-bench report results/history/{engine} --history-readme README.md")


GIT_QUOTE = re.compile(r"`git show ([0-9a-f]{7,40}):([^`\s]+)`: ([^)]*)\)")


def misquoted(text: str, show) -> list[str]:
    """Figures after a ``git show COMMIT:PATH``: that the file at that commit does not hold (``show`` reads it, None
    when the commit is not in this clone)."""
    out = []
    for m in GIT_QUOTE.finditer(text):
        held = show(m.group(1), m.group(2))
        if held is None:
            continue
        numbers = set(re.findall(r"\d+(?:\.\d+)?", held))
        out += [f"{m.group(1)}:{m.group(2)}: {n}" for f in FIGURE.finditer(m.group(3))
                for n in re.findall(r"\d+(?:\.\d+)?", f.group(0)) if n not in numbers]
    return out


def _git_show(commit: str, path: str) -> str | None:
    import subprocess

    proc = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_figure_quoted_from_history_is_in_that_file(page: Path) -> None:
    assert misquoted(page.read_text(encoding="utf-8"), _git_show) == []


def test_a_misquoted_figure_from_history_is_caught() -> None:
    files = {("abc1234", "f.txt"): "paced noop median  2.45 % of the period\nrep 0 step hot 10.1 us\n"}
    text = ("(`git show abc1234:f.txt`: 2.45 % for the call) (`git show abc1234:f.txt`: 10.1-11.5 us) "
            "(`git show fffffff:g.txt`: 9 us)")
    assert misquoted(text, lambda c, p: files.get((c, p))) == ["abc1234:f.txt: 11.5"]
