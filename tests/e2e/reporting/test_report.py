"""``make report``: one overview per sweep (the swept settings as axes, the unpruned model as a line,
standard errors as bars, grouped bars for categories, numbers to their precision), failed runs out of
the way, and ``make clean-failed``. Unit tests on rows written through the store API; one e2e test on a
real tiny sweep of two presets through run.py and make."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.config import ROOT
from helpers.jobs import SMOKE, run_cli

from replaceme_exp.results import ResultsStore


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """``-m experiment=replaceme_ls,uidl_baseline alpha=0,100`` on the tiny job (UIDL at alpha 100 is its
    alpha-0 configuration: skipped), one job that fails mid-run, then ``make report``."""
    results = tmp_path_factory.mktemp("report")
    sweep, _ = run_cli(["-m", *SMOKE, "experiment=replaceme_ls,uidl_baseline", "alpha=0,100"], results)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    failed, _ = run_cli([*SMOKE, "n_prune=99"], results)  # fails after loading: 6 blocks
    assert failed.returncode == 1
    proc = subprocess.run(
        ["make", "-s", "-o", "setup", "report", f"RESULTS={results}", f"PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results, sweep.stdout + sweep.stderr, proc.stdout


@pytest.mark.slow
def test_a_sweep_of_two_presets_is_one_sweep_named_for_both_with_one_overview(tiny_results):
    results, sweep_log, out = tiny_results
    rows = ResultsStore(results).load()
    assert len(rows) == 4
    swept = rows[rows["sweep_name"].notna() & (rows["status"] == "finished")]
    assert set(swept["sweep_name"]) == {"experiment=replaceme_ls,uidl_baseline"} and len(swept) == 3
    assert set(swept["method"]) == {"ReplaceMe LS", "UIDL"}
    # the sweep's summary says that UIDL ignores alpha
    assert "alpha does nothing for objective=identity takes no alpha: its jobs at alpha=100" in sweep_log
    sweep_id = swept["sweep_id"].iloc[0]
    # UIDL at alpha 100 is a job of the sweep, skipped as its alpha-0 configuration: counted, its run shown once
    title = f"experiment=replaceme_ls,uidl_baseline (sweep {sweep_id})"
    assert f"{title}: 3 finished, 1 skipped (finished before), 0 failed; read 4 rows" in out
    page = (results / "report" / "sweeps" / f"{sweep_id}.md").read_text()
    assert "Swept: method (ReplaceMe LS, UIDL); alpha (0, 100)." in page
    assert "![ppl_heldout](" in page and (results / "report" / "sweeps" / sweep_id / "ppl_heldout.png").is_file()
    assert "## Runs (3)" in page and page.count("| finished + 1 skipped |") == 1
    assert len(list((results / "report").rglob("*.png"))) <= 2  # ppl_heldout and cos_dist: eval=heldout has no lm-eval
    everything = (results / "report" / "all.md").read_text()
    assert "n_prune=99" not in everything and "1 failed run hidden" in everything
