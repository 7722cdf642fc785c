"""``make report`` on a real tiny sweep: tables of the finished runs with the settings that vary,
the failed runs with their errors, figures per swept setting, and counts of what was read, shown
and skipped."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from helpers.config import ROOT
from helpers.jobs import SMOKE, run_cli

from replaceme_exp.reporting.report import build_groups, split_runs, varying_settings
from replaceme_exp.results import ResultsStore


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """A 2-job sweep over alpha (ridge), one job that fails mid-run, the make report output."""
    results = tmp_path_factory.mktemp("report")
    sweep, _ = run_cli(["-m", *SMOKE, "alpha=0,100"], results)
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
    return results, proc.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_make_report_prints_what_it_read_showed_and_skipped(tiny_results):
    results, out = tiny_results
    rows = ResultsStore(results).load()
    assert len(rows) == 3
    assert f"read 3 rows from 3 row files under {results}/runs" in out
    assert "All runs: read 3 rows, showing 2 finished runs, 1 failed, 0 skipped" in out
    sweep_id = rows[rows["alpha"] == 100]["sweep_id"].iloc[0]
    assert f"Sweep {sweep_id} (sweep): read 2 rows, showing 2 finished runs, 0 failed, 0 skipped" in out


@pytest.mark.e2e
@pytest.mark.slow
def test_the_tables_show_the_varying_setting_the_metrics_and_the_failure(tiny_results):
    results, _ = tiny_results
    rows = ResultsStore(results).load()
    report = results / "report"
    index = (report / "index.md").read_text()
    assert "[All runs](all.md) | 3 | 2 | 1 | 0 |" in index
    everything = (report / "all.md").read_text()
    header = next(line for line in everything.splitlines() if line.startswith("| run_id"))
    assert "| alpha |" in header and "| ppl_heldout |" in header and "| cuts |" in header
    for run in rows[rows["status"] == "finished"].to_dict("records"):
        line = next(line for line in everything.splitlines() if line.startswith(f"| {run['run_id']} "))
        assert f"{run['ppl_heldout']:.4g}" in line and f"| {run['alpha']:g} |" in line
    failed = rows[rows["status"] == "failed"].iloc[0]
    assert f"- `{failed['run_id']}`" in everything and "n_prune=99: the model has 6 blocks" in everything
    assert "Fixed settings: job=prune, model=tiny_llama" in everything
    sweep_id = rows[rows["alpha"] == 100]["sweep_id"].iloc[0]
    assert (report / "sweeps" / f"{sweep_id}.md").read_text().count("\n| ") == 3  # header + 2 runs


@pytest.mark.e2e
@pytest.mark.slow
def test_figures_per_swept_setting_and_honest_about_missing_metrics(tiny_results):
    results, _ = tiny_results
    folder = results / "report" / "all"
    ppl = folder / "ppl_heldout__vs__alpha.png"
    assert ppl.stat().st_size > 5000
    assert not (folder / "avg_acc__vs__alpha.png").exists()  # eval=quick records no accuracy
    assert "![ppl_heldout__vs__alpha](all/ppl_heldout__vs__alpha.png)" in (results / "report" / "all.md").read_text()


@pytest.mark.unit
def test_skipped_rows_are_counted_with_their_reason():
    rows = pd.DataFrame(
        [
            {"run_id": "a", "config_hash": "c1", "status": "failed", "started_at": "1", "alpha": 0.0},
            {"run_id": "b", "config_hash": "c1", "status": "finished", "started_at": "2", "alpha": 0.0},
            {"run_id": "c", "config_hash": "c1", "status": "finished", "started_at": "3", "alpha": 0.0},
            {"run_id": "d", "config_hash": "c2", "status": "failed", "started_at": "4", "alpha": 1.0},
            {"run_id": "e", "config_hash": "c2", "status": "failed", "started_at": "5", "alpha": 1.0},
            {"run_id": "f", "config_hash": "c3", "status": "running", "started_at": "6", "alpha": 2.0},
        ]
    )
    group = split_runs(rows, "all", "All runs")
    assert list(group.shown["run_id"]) == ["c"] and list(group.failed["run_id"]) == ["e"]
    assert group.skipped == {
        "older finished runs of a configuration shown by its latest run": 1,
        "failed runs of a configuration that also finished": 1,
        "older failures of a configuration listed by its latest failure": 1,
        "rows with status=running (unfinished: killed or still running)": 1,
    }
    assert group.counts().startswith("read 6 rows, showing 1 finished runs, 1 failed, 4 skipped")


@pytest.mark.unit
def test_varying_settings_and_groups_by_sweep():
    rows = pd.DataFrame(
        [
            {"run_id": "a", "config_hash": "1", "status": "finished", "sweep_id": "s1", "alpha": 0.0, "seed": 1,
             "model": "m", "objective": "ls"},
            {"run_id": "b", "config_hash": "2", "status": "finished", "sweep_id": "s1", "alpha": 0, "seed": 2,
             "model": "m", "objective": "ls"},
            {"run_id": "c", "config_hash": "3", "status": "finished", "sweep_id": None, "alpha": 10.0, "seed": 1,
             "model": "m", "objective": None},
        ]
    )  # fmt: skip
    assert varying_settings(rows) == ["objective", "alpha", "seed"]
    assert varying_settings(rows.iloc[:2]) == ["seed"]  # 0 and 0.0 are one value
    groups = build_groups(rows)
    assert [g.name for g in groups] == ["all", "no_sweep", "s1"]
    assert [len(g.shown) for g in groups] == [3, 1, 2]
