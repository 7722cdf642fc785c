"""The self-contained HTML dashboard of a results store, rendered and driven in headless Chromium
(Debian's /usr/bin/chromium through Playwright): rows, filters, the figure, run links, and no
network request. Without Chromium the browser test is skipped, unless REPLACEME_REQUIRE_BROWSER=1
(CI), where it fails."""

from __future__ import annotations

import re

from helpers.html_dashboard import store_with_runs

from replaceme_exp.reporting.dashboard import write_dashboard


def test_the_page_embeds_every_row_and_links_each_run_relative_to_itself(tmp_path):
    store_with_runs(tmp_path)
    page, n = write_dashboard(tmp_path)
    text = page.read_text()
    assert n == 6 and page == tmp_path / "dashboard.html"
    assert text.count('"run_id": "') == 6
    assert re.search(r'"_row_file": "runs/cfg0/[0-9a-f]{12}\.parquet"', text)
    assert '"_log_file": "hydra/multirun/s1/0/run.log"' in text
    # nothing to fetch: no external script, style, image or font, and a policy that forbids them
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "default-src 'none'" in text
