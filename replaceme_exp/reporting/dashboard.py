"""A self-contained HTML dashboard of a results store, for teams without W&B: ``make dashboard``.

One HTML file (default ``<results>/dashboard.html``): every row of the store embedded as JSON, the
page's script and style inline, nothing fetched from anywhere. In the page:

- filters: the sweep (``sweep_id``, with its name), the status (finished by default) and each
  setting that takes more than one value among the rows;
- an interactive figure: a metric against a chosen setting (numbers on a linear axis, categories
  side by side), one colour per value of another chosen setting, the unpruned model's value as a
  dashed line where the metric has a ``<metric>_baseline`` column, a tooltip per point;
- the runs table (the settings that vary, the cuts, the key metrics); clicking a run shows its
  whole row (every column) with links to its row file (``runs/<config_hash>/<run_id>.parquet``)
  and its log (``<job_dir>/run.log``: Hydra's job folder), relative to the page.

Reads the rows through :class:`~replaceme_exp.results.store.ResultsStore`.

    python -m replaceme_exp.reporting.dashboard --results results [--out results/dashboard.html]
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
from pathlib import Path

from replaceme_exp.reporting.cells import SETTING_COLUMNS
from replaceme_exp.results.row import decode_cell
from replaceme_exp.results.store import ResultsStore

# Settings offered as filters, axes and series (those that vary among the rows are shown).
SETTINGS = tuple(
    c for c in (*SETTING_COLUMNS, "seed", "job") if not c.endswith("_version") and c != "model_fingerprint"
)
# Metrics shown in the table and first in the figure's choice, where recorded.
KEY_METRICS = ("ppl_heldout", "ppl_heldout_baseline", "avg_acc", "avg_acc_baseline", "rp", "cos_dist_after",
               "compression_ratio", "time_total_s", "energy_kwh")  # fmt: skip
LOG_FILE = "run.log"
# The page: HTML with its script and style inline; {{TITLE}} and {{DATA}} are filled in.
PAGE_TEMPLATE = Path(__file__).with_name("dashboard_page.html")


def _plain(value):
    """A cell as JSON can hold it (NaN -> null, numpy scalars -> Python, JSON text -> lists)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            value = str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    value = decode_cell(value)
    if isinstance(value, (list, dict, str, int, float, bool)) or value is None:
        return value
    return str(value)


def _relative(target: Path, page_dir: Path) -> str:
    return Path(os.path.relpath(target.resolve(), page_dir.resolve())).as_posix()


def dashboard_rows(store: ResultsStore, page_dir: Path) -> list[dict]:
    """Every row of the store as plain JSON values, each with ``_row_file`` and, when its log file
    exists, ``_log_file``: links relative to ``page_dir``."""
    table = store.load()
    rows = []
    for record in table.to_dict("records"):
        row = {k: _plain(v) for k, v in record.items()}
        if row.get("config_hash") and row.get("run_id"):
            row["_row_file"] = _relative(store.row_path(row), page_dir)
        job_dir = row.get("job_dir")
        if isinstance(job_dir, str) and (Path(job_dir) / LOG_FILE).is_file():
            row["_log_file"] = _relative(Path(job_dir) / LOG_FILE, page_dir)
        rows.append(row)
    return rows


def render(rows: list[dict], title: str) -> str:
    """The page: ``rows`` embedded as JSON, inline script and style."""
    data = {"rows": rows, "settings": list(SETTINGS), "key_metrics": list(KEY_METRICS)}
    payload = json.dumps(data, default=str).replace("</", "<\\/")
    page = PAGE_TEMPLATE.read_text(encoding="utf-8")
    return page.replace("{{TITLE}}", html.escape(title)).replace("{{DATA}}", payload)


def write_dashboard(results_dir: str | Path, out: str | Path | None = None) -> tuple[Path, int]:
    """Write the dashboard of the store under ``results_dir``; returns (its path, rows embedded)."""
    store = ResultsStore(results_dir)
    out = Path(out) if out is not None else Path(results_dir) / "dashboard.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = dashboard_rows(store, out.parent)
    out.write_text(render(rows, f"Runs of {Path(results_dir).resolve().name}"), encoding="utf-8")
    return out, len(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default=None, help="default: <results>/dashboard.html")
    args = parser.parse_args(argv)
    if not (Path(args.results) / "runs").is_dir():
        raise SystemExit(f"RESULTS={args.results}: no results store there (no runs/ folder)")
    path, n = write_dashboard(args.results, args.out)
    print(f"dashboard of {n} rows: {path} (open it in a browser; it fetches nothing)")


if __name__ == "__main__":
    main()
