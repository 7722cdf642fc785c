"""The self-contained HTML dashboard of a results store, rendered and driven in headless Chromium
(Debian's /usr/bin/chromium through Playwright): rows, filters, the figure, run links, and no
network request. Without Chromium the browser test is skipped, unless REPLACEME_REQUIRE_BROWSER=1
(CI), where it fails."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers.html_dashboard import store_with_runs

from replaceme_exp.reporting.dashboard import write_dashboard


CHROMIUM = os.environ.get("REPLACEME_CHROMIUM", "/usr/bin/chromium")


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]  # fmt: skip


SCREENSHOT_DIR = os.environ.get("REPLACEME_SCREENSHOTS")  # keep the page's screenshot there (to look at it)


def _chromium_or_skip():
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        if os.environ.get("REPLACEME_REQUIRE_BROWSER") == "1":
            pytest.fail(f"REPLACEME_REQUIRE_BROWSER=1 but no Chromium at {CHROMIUM} (apt-get install chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; CI sets REPLACEME_REQUIRE_BROWSER=1)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("REPLACEME_REQUIRE_BROWSER") == "1":
            pytest.fail("REPLACEME_REQUIRE_BROWSER=1 but Playwright is not installed (pip install -e '.[dev]')")
        pytest.skip("Playwright is not installed (the dev extra)")
    return sync_playwright


@pytest.mark.slow
def test_the_dashboard_in_headless_chromium(tmp_path):
    sync_playwright = _chromium_or_skip()
    store_with_runs(tmp_path)
    page_path, _ = write_dashboard(tmp_path)
    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("request", lambda r: requests.append(r.url))
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            # finished rows of both sweeps by default
            assert page.locator("#runs tbody tr").count() == 5
            assert page.text_content("#count") == "5 of 6 rows shown"
            # one sweep, then one objective: fewer rows
            page.select_option("#sweep", "s1")
            assert page.locator("#runs tbody tr").count() == 4
            page.select_option("#filter-objective", "ls")
            assert page.locator("#runs tbody tr").count() == 2
            # the figure: ppl_heldout against alpha, a point per shown run, the baseline as a line
            assert page.input_value("#metric") == "ppl_heldout"
            assert page.input_value("#xaxis") == "objective"
            page.select_option("#xaxis", "alpha")
            page.select_option("#series", "objective")
            assert page.locator("#figure circle.point").count() == 2
            assert page.locator("#figure line.baseline").count() == 1
            assert "ppl_heldout = 28" in page.locator("#figure circle.point title").all_text_contents()[1]
            page.select_option("#filter-objective", "")
            assert page.locator("#figure circle.point").count() == 4
            # each run's log linked relative to the page; a click shows the whole row
            links = page.locator("#runs a.log-link")
            assert links.count() == 4 and links.first.get_attribute("href").startswith("hydra/multirun/s1/")
            page.locator("#runs tbody tr").first.click()
            assert page.locator("#detail a.row-link").get_attribute("href").startswith("runs/cfg")
            assert "config_hash" in page.text_content("#detail") and "n_prune" in page.text_content("#detail")
            page.select_option("#status", "failed")
            assert page.locator("#runs tbody tr").count() == 1
            page.select_option("#status", "finished")
            shot = Path(SCREENSHOT_DIR or tmp_path) / "dashboard.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert requests == [page_path.as_uri()]  # the page itself, nothing else
    assert shot.stat().st_size > 10_000
