"""The README is a front page and the docs pages hold the rest: every relative link and anchor resolves, every
generated section sits in the one file :mod:`harness.output.sections` names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.output import sections

ROOT = Path(__file__).resolve().parents[1]
PAGES = sections.pages(ROOT)  # README.md, ARCHITECTURE.md, docs/, results/ and examples/ READMEs
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MARKERS = {name: name for name in sections.FILES}
FRONT_PAGE_LINES = 400


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text (code blocks skipped; a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    fence = False
    for line in text.splitlines():
        fence ^= line.startswith("```")
        match = None if fence else re.match(r"^#{1,6} (.+)$", line)
        if match:
            base = slug(match.group(1))
            seen[base if base not in seen else f"{base}-{seen[base]}"] = 0
            seen[base] = seen.get(base, 0) + 1
    return set(seen)


def links(text: str) -> list[str]:
    """Relative link targets of a markdown text, code blocks and code spans left out."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`\n]*`(?!\])", "", prose)
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z]+:", t)]


def broken(page: Path) -> list[str]:
    """The links of ``page`` to a missing file or to a heading its file does not have."""
    out = []
    for target in links(page.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            out.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(file.read_text(encoding="utf-8")):
            out.append(f"{target}: no such heading")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_and_anchor_resolves(page: Path) -> None:
    assert broken(page) == []


def planted(folder: Path, pages: dict[str, str]) -> Path:
    """``pages`` (path -> text) written under ``folder``, their folders made; the last one's path (the page the
    checks read, beside what it refers to)."""
    for name, text in pages.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / name


def test_a_broken_link_or_anchor_is_caught(tmp_path: Path) -> None:
    page = planted(tmp_path, {"a.md": "# Title, with `code`\n\n## Two words\n", "b.md": (
        "[ok](a.md#title-with-code) [ok](a.md#two-words) [ok](#here) `[not a link](x.md)`\n"
        "[gone](missing.md) [bad](a.md#three-words) ![img](a.png) [web](https://example.org)\n# Here\n")})
    assert broken(page) == ["missing.md: no such file", "a.md#three-words: no such heading", "a.png: no such file"]


def test_the_readme_is_a_front_page() -> None:
    """At most about a screenful of screens; the quick start, the headline, adding a design, CI, and a link to
    every docs page."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= FRONT_PAGE_LINES
    assert "make bench" in text and "make test" in text  # .ci/run and the hooks grep for them
    headings = anchors(text)
    for heading in ("quick-start", "results-reference-run", "add-your-design", "benchmarks-in-ci",
                    "where-everything-else-is"):
        assert heading in headings
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in text, f"the README does not link {page.name}"


@pytest.mark.parametrize("name", sorted(sections.FILES))
def test_each_generated_section_lives_in_the_file_the_map_names(name: str) -> None:
    begin, end = f"<!-- {MARKERS[name]}:begin -->", f"<!-- {MARKERS[name]}:end -->"
    holders = [p for p in PAGES if begin in p.read_text(encoding="utf-8")]
    assert holders == [sections.doc_path(name)]
    text = sections.doc_path(name).read_text(encoding="utf-8")
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end)


def test_beside_finds_a_section_relative_to_the_results_file(tmp_path: Path) -> None:
    assert sections.beside(tmp_path / "README.md", "times") == tmp_path / sections.FILES["times"]
    assert sections.beside(ROOT / "README.md", "growth") == sections.doc_path("growth")


def test_no_page_repeats_a_heading() -> None:
    """A heading twice on one page is a section merged in twice (docs/calibration.md once held two histories and
    two TVM sections, the older one stale): its anchor links reach only the first."""
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "ARCHITECTURE.md"]:
        headings, fenced = [], False
        for line in page.read_text().splitlines():
            fenced ^= line.startswith("```")
            if line.startswith("#") and not fenced:  # a shell comment in a code block is no heading
                headings.append(line.strip())
        repeated = sorted({h for h in headings if headings.count(h) > 1})
        assert not repeated, f"{page.name} repeats {repeated}"
