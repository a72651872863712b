"""The site in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by Selenium,
opening the site built from the committed results from the file system, as a reader would. Every page loads
without a console error, every figure draws as many points as its CSV holds, a table sorts and filters, every link
resolves. Screenshots of every page are kept in ``build/test-artifacts/site/`` (or ``$KVB_TEST_ARTIFACTS``).

Without a browser the tests are skipped, saying what to install; ``.ci/run`` sets ``KVB_REQUIRE_BROWSER=1``, which
turns that skip into a failure."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from harness.site.build import build_site
from harness.site.html import PAGES

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("KVB_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("KVB_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000")
ARTIFACTS = Path(os.environ.get("KVB_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts")) / "site"

pytestmark = pytest.mark.slow  # a browser and a site built from the committed results (make test-slow, .ci/run)


def _missing() -> str:
    """What this machine lacks to run the browser tests, "" when nothing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    lacking = [p for p in (CHROMIUM, DRIVER) if not (Path(p).is_file() and os.access(p, os.X_OK))]
    return f"no {' or '.join(lacking)}: apt-get install -y chromium chromium-driver" if lacking else ""


@pytest.fixture(scope="module")
def browser():
    if reason := _missing():
        if os.environ.get("KVB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"KVB_REQUIRE_BROWSER=1 (CI) but {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site `make site` builds, from the committed results."""
    return build_site([ROOT / "results" / "reference"], tmp_path_factory.mktemp("site") / "site", ROOT / "results")


def _open(driver, page: Path) -> None:
    """Load a page and wait until every figure has drawn (its point count stops changing)."""
    driver.get(page.as_uri())
    last, still = -1, 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and still < 3:
        count = driver.execute_script("return document.querySelectorAll('.js-plotly-plot .point').length")
        still = still + 1 if count == last else 0
        last = count
        time.sleep(0.2)


def _csv_points(site: Path, path: str) -> int:
    with (site / path).open(newline="") as fh:
        return len(list(csv.DictReader(fh)))


@pytest.mark.parametrize("name", [name for name, _ in PAGES])
def test_a_page_loads_without_console_errors_and_draws_every_figures_points(browser, site: Path, name: str) -> None:
    _open(browser, site / name)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    figures = browser.find_elements("css selector", "figure.plot")
    for fig in figures:
        slug, path = fig.get_attribute("data-figure"), fig.get_attribute("data-csv")
        drawn = browser.execute_script(
            "return document.getElementById(arguments[0]).querySelectorAll('.point').length", slug)
        assert drawn == _csv_points(site, path) > 0, f"{name}: {slug} drew {drawn} points, its CSV holds " \
                                                      f"{_csv_points(site, path)}"
        assert browser.execute_script("return document.getElementById(arguments[0]).data.length", slug) > 0
    if name != "index.html":
        assert figures, f"{name}: no figure"
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1400, min(height + 40, 6000))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / f"{Path(name).stem}.png"))
    browser.set_window_size(1400, 1000)


def _column(browser, table_id: str, col: int) -> list[float]:
    return browser.execute_script(
        "return Array.from(document.getElementById(arguments[0]).tBodies[0].rows)"
        ".filter(r => r.style.display !== 'none').map(r => r.cells[arguments[1]].getAttribute('data-v'))"
        ".filter(v => v !== null).map(parseFloat)", table_id, col)


def test_a_table_sorts_on_a_click_and_filters_as_one_types(browser, site: Path) -> None:
    _open(browser, site / "scenarios.html")
    table = browser.find_element("css selector", "table.sortable")
    ident = table.get_attribute("id")
    headers = table.find_elements("css selector", "thead th")
    col = [h.text for h in headers].index("ns/seq-step")
    before = _column(browser, ident, col)
    assert before != sorted(before)  # the run's order, not the sorted one: the click has work to do
    headers[col].click()
    assert _column(browser, ident, col) == sorted(before)
    headers[col].click()
    assert _column(browser, ident, col) == sorted(before, reverse=True)
    box = browser.find_element("css selector", f'input.filter[data-table="{ident}"]')
    box.send_keys("paper batched")
    shown = browser.execute_script(
        "return Array.from(document.getElementById(arguments[0]).tBodies[0].rows)"
        ".filter(r => r.style.display !== 'none').map(r => r.textContent.toLowerCase())", ident)
    assert shown and all("paper" in t and "batched" in t for t in shown)
    total = len(table.find_elements("css selector", "tbody tr"))
    assert browser.find_element("id", f"{ident}-count").text == f"{len(shown)} of {total} rows"


def test_every_link_resolves(browser, site: Path) -> None:
    ids: dict[Path, set[str]] = {}
    broken = []
    for name, _ in PAGES:
        _open(browser, site / name)
        hrefs = browser.execute_script("return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        for href in hrefs:
            url = urlparse(href)
            if url.scheme != "file":
                broken.append(f"{name}: {href} leaves the site")
                continue
            target = Path(unquote(url.path))
            if not target.is_file() or site.resolve() not in target.resolve().parents:
                broken.append(f"{name}: {href} names no file of the site")
            elif url.fragment:
                if target not in ids:
                    ids[target] = set(browser.execute_script(
                        "return Array.from(document.querySelectorAll('[id]')).map(e => e.id)")) \
                        if target == site / name else _ids(target)
                if url.fragment not in ids[target]:
                    broken.append(f"{name}: {href} names no heading")
    assert not broken, broken[:10]


def _ids(page: Path) -> set[str]:
    import re

    return set(re.findall(r'\sid="([^"]+)"', page.read_text()))


def test_ci_installs_the_browser_and_forbids_the_skip(monkeypatch) -> None:
    """`.ci/run` installs chromium as it installs valgrind, and sets KVB_REQUIRE_BROWSER=1 for the tests: a CI
    machine without the browser fails them; elsewhere the skip says what to install."""
    import sys

    text = (ROOT / ".ci" / "run").read_text()
    assert "chromium chromium-driver" in text and "KVB_REQUIRE_BROWSER=1" in text
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    assert "apt-get install -y chromium chromium-driver" in _missing()
