"""Jobs and sweeps: config composition, rows, skipping finished jobs, failed rows, caches."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers.jobs import SMOKE, run_cli

from replaceme_exp.results import ResultsStore


@pytest.mark.slow
def test_hydra_sweep_runs_four_jobs_then_skips_them(tmp_path):
    sweep = ["-m", *SMOKE, "objective=ls,identity", "alpha=0,10"]
    first, first_s = run_cli(sweep, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    table = ResultsStore(tmp_path).load()
    # identity takes no alpha: alpha=0 and alpha=10 are one configuration, run once.
    assert (first.stdout + first.stderr).count("job skipped: finished before as run") == 1
    assert len(table) == 3 and set(table["status"]) == {"finished"}
    assert sorted(zip(table["objective"], table["alpha"])) == [("identity", 0.0), ("ls", 0.0), ("ls", 10.0)]
    assert table["sweep_id"].nunique() == 1
    # One capture serves all jobs (same model, data and cut), one baseline perplexity too.
    assert (table["time_capture_s"] > 0).sum() == 1
    # Baseline perplexity and held-out distance without T: once each for all jobs.
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 2
    assert table["ppl_heldout_baseline"].nunique() == 1
    profile = json.loads(table["candidate_distances"].iloc[0])
    assert [c[:2] for c in profile] == [[s, s + 2] for s in range(1, 5)]
    assert json.loads(table["cuts"].iloc[0])[0] == min(profile, key=lambda c: c[2])[:2]
    ls = table[table["objective"] == "ls"].set_index("alpha")
    assert ls.loc[0.0, "regularizer"] == "none" and ls.loc[10.0, "regularizer"] == "l2"
    assert ls.loc[0.0, "cos_dist_after"] != ls.loc[10.0, "cos_dist_after"]
    assert table["cos_dist_before"].nunique() == 1
    identity = table[table["objective"] == "identity"]
    assert (identity["cos_dist_after"] == identity["cos_dist_before"]).all()

    second, second_s = run_cli(sweep, tmp_path)
    assert second.returncode == 0
    assert (second.stdout + second.stderr).count("job skipped: finished before as run") == 4
    assert len(ResultsStore(tmp_path).load()) == 3
    assert second_s < first_s


@pytest.mark.slow
def test_a_failed_job_does_not_stop_the_sweep_but_the_sweep_exits_non_zero_with_a_summary(tmp_path):
    proc, _ = run_cli(["-m", *SMOKE, "n_prune=2,99", "alpha=0.5,abc"], tmp_path)
    assert proc.returncode != 0  # after all jobs ran
    table = ResultsStore(tmp_path).load()
    assert len(table) == 4 and sorted(table["status"]) == ["failed", "failed", "failed", "finished"]
    finished = table[table["status"] == "finished"].iloc[0]
    assert finished["n_prune"] == 2 and finished["alpha"] == 0.5
    errors = " | ".join(table["error"].dropna())
    assert "n_prune=99" in errors and "alpha='abc': must be a finite number >= 0" in errors
    log = proc.stdout + proc.stderr
    assert "sweep: 1 finished, 0 skipped, 3 failed" in log
    line = next(line for line in log.splitlines() if "n_prune=99,alpha=abc" in line and "  failed " in line)
    assert "ConfigError: alpha='abc'" in line
    assert "Traceback" not in log  # configuration errors are one line each


@pytest.mark.slow
def test_explicit_cuts_from_the_command_line(tmp_path):
    proc, _ = run_cli([*SMOKE, "cuts=[[1,2],[4,6]]"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = ResultsStore(tmp_path).load().iloc[0]
    assert json.loads(row["cuts"]) == [[1, 2], [4, 6]] and row["n_prune"] == 3 and row["num_lts"] == 2
    assert pd.isna(row["selection_metric"])


@pytest.mark.slow
def test_parallel_local_workers_lose_no_row_and_prefix_their_console_lines(tmp_path):
    sweep = ["seed=1,2,3,4", "objective=ls,identity"]
    proc, _ = run_cli(
        [
            "-m",
            "hydra/launcher=local_parallel",
            "hydra.launcher.n_jobs=2",
            *SMOKE,
            *sweep,
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = ResultsStore(tmp_path).load()
    assert len(table) == 8 and set(table["status"]) == {"finished"} and table["config_hash"].nunique() == 8
    assert not list((tmp_path / "runs").rglob("*.tmp"))
    # each job's console lines carry its number; its own run.log does not
    console = (proc.stdout + proc.stderr).splitlines()
    for job in range(8):
        assert any(line.startswith(f"[job {job}] ") and "stage load" in line for line in console), job
    logs = list((tmp_path / "hydra" / "multirun").glob("*/*/run.log"))
    assert len(logs) == 8 and all("[job " not in log.read_text() and "stage load" in log.read_text() for log in logs)

    again, _ = run_cli(["-m", "hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2", *SMOKE, *sweep], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    console = (again.stdout + again.stderr).splitlines()
    for job in range(8):  # a skipped job prints one line
        (line,) = [line for line in console if line.startswith(f"[job {job}] ")]
        assert "job skipped: finished before as run" in line
