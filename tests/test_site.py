"""`kvblock-bench site` without a browser: several runs of several machines, their ranges and labels, the commits it
refuses to mix, the folders it refuses to replace, a failed build leaving the last site, and every figure's CSV.
The browser's view of it: tests/test_site_browser.py."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from harness.base.rows import read_rows, write_rows
from harness.cli import main
from harness.site import build as site_build
from harness.site.build import MARK, build_site
from harness.site.collect import SiteInputError, load_runs

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "results" / "sample"


def run_copy(dest: Path, scale: float = 1.0, l2: str | None = None, commit: str | None = None,
             started: str | None = None, **meta_extra) -> Path:
    """The sample run as another run: its timings times ``scale``, another L2 (another machine), commit or start."""
    shutil.copytree(SAMPLE, dest, ignore=shutil.ignore_patterns("raw", "figures"))
    rows = read_rows(dest / "results.csv")
    if scale != 1.0:
        rows = [r.__class__(**{**r.__dict__, "value": r.value * scale}) if r.metric == "seq_step_ns" else r
                for r in rows]
    write_rows(dest / "results.csv", rows)
    meta = json.loads((dest / "meta.json").read_text())
    if l2:
        meta["caches"] = {**meta.get("caches", {}), "L2": l2}
    meta["git_commit"] = commit or meta.get("git_commit")
    meta["started"] = started or meta.get("started")
    meta.update(meta_extra)
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three runs in a CI artifact's nesting: two of one machine (one a tenth slower), one of another machine."""
    root = tmp_path_factory.mktemp("artifacts")
    run_copy(root / "ubuntu-24.04" / "run-a", started="2026-12-01T10:00:00+0000")
    run_copy(root / "ubuntu-24.04" / "run-b", scale=1.1, started="2026-12-02T10:00:00+0000")
    run_copy(root / "ubuntu-24.04-arm" / "run-c", l2="2048K (8-way)")
    return root


@pytest.fixture(scope="module")
def site(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site([runs], tmp_path_factory.mktemp("site") / "site", ROOT / "results")


def test_runs_are_grouped_by_machine_and_named_by_it(runs: Path) -> None:
    machines = load_runs([runs])
    assert [len(m.runs) for m in machines] == [2, 1]
    assert machines[0].newest.run_dir.name == "run-b"  # newest first, by its start
    assert "L2 2048K" in machines[1].name and "L2 2048K" not in machines[0].name  # host.machine_name, the one name
    assert machines[0].key != machines[1].key


def test_every_page_is_written_and_every_figure_names_its_machine(site: Path, runs: Path) -> None:
    for name in ("index", "reference", "scenarios", "machines", "history", "ci", "calibration"):
        assert (site / f"{name}.html").is_file(), name
    figures = 0
    for page in site.glob("*.html"):
        text = page.read_text()
        blocks = re.findall(r'<figure class="plot" data-csv="(data/[^"]+)" data-points="(\d+)" data-figure="([^"]+)">'
                            r'(.*?)</figure>', text, re.S)
        for path, points, _, body in blocks:
            figures += 1
            with (site / path).open() as fh:
                assert len(list(csv.DictReader(fh))) == int(points), path
            assert "machine: " in body, path
    assert figures >= 10
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000  # drawn offline, from the site itself


def test_the_site_fetches_nothing_from_elsewhere(site: Path) -> None:
    for page in site.glob("*.html"):
        text = page.read_text()
        assert not re.search(r'<(script|link|img)[^>]+(src|href)="(https?:)?//', text), page.name
    assert "cdn" not in (site / "index.html").read_text().lower()


def test_ranges_across_runs_and_the_machines_side_by_side(site: Path) -> None:
    scenarios = (site / "scenarios.html").read_text()
    assert "(2 runs)" in scenarios and "1 run" in scenarios  # the two-run machine has ranges, the other says one run
    machines = (site / "machines.html").read_text()
    assert "× flat on M2" in machines and "M2: " in machines and "holds on every machine?" in machines
    assert "than flat on every machine (2)" in machines
    assert "ranking of the article" in machines


def test_runs_of_different_commits_are_refused_unless_told(runs: Path, tmp_path: Path) -> None:
    other = run_copy(tmp_path / "other", commit="0123456789ab")
    with pytest.raises(SiteInputError, match=r"runs of 2 commits .*0123456789ab.*--allow-mixed-commits"):
        build_site([runs, other], tmp_path / "site", ROOT / "results")
    assert not (tmp_path / "site").exists()
    build_site([runs, other], tmp_path / "site", ROOT / "results", allow_mixed_commits=True)
    assert (tmp_path / "site" / "index.html").is_file()


def test_it_replaces_only_a_folder_it_wrote_and_never_a_run(runs: Path, tmp_path: Path) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.txt").write_text("mine")
    with pytest.raises(SiteInputError, match="a folder `site` did not write"):
        build_site([runs], mine, ROOT / "results")
    assert (mine / "thesis.txt").read_text() == "mine"
    with pytest.raises(SiteInputError, match="holds the run"):
        build_site([runs / "ubuntu-24.04" / "run-a"], runs / "ubuntu-24.04", ROOT / "results")
    with pytest.raises(SiteInputError, match="no run folder"):
        build_site([tmp_path / "notes"], tmp_path / "site", ROOT / "results")


def test_a_failed_build_leaves_the_previous_site(runs: Path, tmp_path: Path, monkeypatch) -> None:
    out = build_site([runs], tmp_path / "site", ROOT / "results")
    before = (out / "index.html").read_text()

    def broken(*args):
        raise RuntimeError("a page that cannot be drawn")

    monkeypatch.setattr(site_build.run_pages, "machines_page", broken)
    with pytest.raises(RuntimeError):
        build_site([runs], out, ROOT / "results")
    assert (out / "index.html").read_text() == before and (out / MARK).is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["site"]  # no half-built folder left beside it


def test_the_command_line_builds_it_and_says_where(runs: Path, tmp_path: Path, capsys) -> None:
    assert main(["site", str(runs), "--out", str(tmp_path / "site"), "--results", str(ROOT / "results")]) == 0
    assert f"site: {tmp_path / 'site' / 'index.html'}" in capsys.readouterr().out
    assert main(["site", str(tmp_path / "nothing"), "--out", str(tmp_path / "site2")]) == 2
    assert "nothing: no such file or folder" in capsys.readouterr().err
