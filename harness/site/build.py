"""``kvblock-bench site``: the static site of runs and committed studies, built whole, then put in place."""

from __future__ import annotations

import shutil
import tempfile
from importlib import resources
from pathlib import Path

from plotly.offline import get_plotlyjs

from harness.base.files import atomic_write_text
from harness.errors import WriteError
from harness.output.formatting import machine_line
from harness.site import results_pages, run_pages
from harness.site.collect import SiteInputError, load_runs
from harness.site.html import PAGES, esc, page

MARK = ".kvblock-bench-site"  # in every folder `site` writes: only such a folder is ever replaced


def _check_out(out: Path, runs: list[Path]) -> None:
    if out.exists() and not out.is_dir():
        raise SiteInputError(f"--out {out}: a file, not a folder; give a new folder or one `site` wrote")
    inside = [r for r in runs if out.resolve() in [r.resolve(), *r.resolve().parents]]
    if inside:
        raise SiteInputError(f"--out {out}: holds the run {inside[0]}; give a folder outside the runs")
    if out.is_dir() and any(out.iterdir()) and not (out / MARK).is_file():
        raise SiteInputError(f"--out {out}: a folder `site` did not write (it holds other files, replaced by the site "
                             "otherwise); give a new folder or one `site` wrote")


def _assets(site: Path) -> None:
    atomic_write_text(site / "assets" / "plotly.min.js", get_plotlyjs())
    for name in ("site.css", "site.js"):
        atomic_write_text(site / "assets" / name, resources.files("harness.site").joinpath("assets", name).read_text())


def _pages(machines: list, root: Path, site: Path) -> dict[str, tuple[str, bool]]:
    """Each page's body and whether it draws figures."""
    commits = sorted({str(r.meta.get("git_commit", "?")) for m in machines for r in m.runs})
    runs = run_pages.runs_table(machines, "runs")
    return {
        "index.html": (run_pages.overview(machines, commits) + runs, False),
        "reference.html": (run_pages.reference_page(machines, site), True),
        "scenarios.html": (run_pages.scenarios_page(machines, site), True),
        "machines.html": (run_pages.machines_page(machines, site), True),
        "history.html": (results_pages.history_page(root, site), True),
        "ci.html": (results_pages.ci_page(root, site), True),
        "calibration.html": (results_pages.calibration_page(root, site), True),
    }


def build_site(paths: list[Path], out: Path, root: Path = Path("results"), allow_mixed_commits: bool = False) -> Path:
    """The site of the runs at or under ``paths`` and of ``root``'s committed studies, in ``out`` (replaced whole,
    and only when the new one is complete: a failure leaves the previous site as it was)."""
    from harness.site.collect import find_runs

    _check_out(out, find_runs(paths))
    machines = load_runs(paths, allow_mixed_commits)
    out.parent.mkdir(parents=True, exist_ok=True)
    site = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _assets(site)
        titles = dict(PAGES)
        runs = sum(len(m.runs) for m in machines)
        footer = (f"kvblock-bench site: {runs} run(s) on {len(machines)} machine(s); every figure names its machine. "
                  + "; ".join(esc(f"{m.name}: {machine_line(m.newest.meta)}") for m in machines))
        for name, (body, figures) in _pages(machines, root, site).items():
            atomic_write_text(site / name, page(name, titles[name], body, footer, figures))
        atomic_write_text(site / MARK, "written by kvblock-bench site; replaced whole by the next\n")
        atomic_write_text(site / ".nojekyll", "")  # GitHub Pages from a branch: serve the files as they are
        _swap(site, out)
    except BaseException:
        shutil.rmtree(site, ignore_errors=True)
        raise
    return out


def _swap(site: Path, out: Path) -> None:
    """``site`` in ``out``'s place; the previous site removed only once the new one is there."""
    old = out.with_name(f".{out.name}-old")
    try:
        if old.exists():
            shutil.rmtree(old)
        if out.exists():
            out.rename(old)
        site.rename(out)
    except OSError as exc:
        if old.exists() and not out.exists():
            old.rename(out)
        raise WriteError(f"--out {out}: cannot put the site in place ({exc.strerror or exc})") from None
    shutil.rmtree(old, ignore_errors=True)
