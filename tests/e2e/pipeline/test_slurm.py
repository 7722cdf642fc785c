"""Sweeps through a real SLURM cluster (scripts/slurm-cluster.sh: one node, the `cpu` partition) with the
``hydra/launcher=slurm_cpu`` preset: rows land, a cancelled job's row says so and a rerun finishes it,
jobs that need one capture compute it once, ``array_parallelism`` holds, a preempted job is requeued
and ends with one finished row, the files land where docs/guides/past-one-machine.md says, and a job
of several tasks splits its captures over them."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.same_job import assert_same_job, run_job
from helpers.slurm import SCRIPT, cluster_turn, slurm, start_sweep, wait_for, waiting_env

from replaceme_exp.results.row import decode_cell
from replaceme_exp.results.store import ResultsStore


pytestmark = pytest.mark.slow

SWEEP_TIMEOUT = 900


def finished_rows(results_dir) -> pd.DataFrame:
    rows = ResultsStore(results_dir).load()
    return rows[rows["status"] == "finished"].sort_values("alpha")


def interval(row) -> tuple[float, float]:
    start = dt.datetime.fromisoformat(row["started_at"]).timestamp()
    return start, start + row["time_total_s"]


def test_a_sweep_lands_every_row_computes_a_shared_capture_once_and_logs_where_the_docs_say(slurm_cluster, tmp_path):
    with cluster_turn():
        proc = start_sweep(tmp_path, slurm_cluster, "alpha=0,10", "hydra.launcher.array_parallelism=2")
        code = proc.wait(timeout=SWEEP_TIMEOUT)
    console = (tmp_path / "sweep.log").read_text()
    assert code == 0, console[-3000:]
    rows = finished_rows(tmp_path)
    assert list(rows["alpha"]) == [0.0, 10.0], console[-3000:]
    # Side by side (the node has 2 CPUs, each job takes one), and one of them found the other's capture:
    # the statistics were computed once, under the lock the two processes shared.
    (a0, a1), (b0, b1) = (interval(r) for _, r in rows.iterrows())
    assert a0 < b1 and b0 < a1, "the two jobs did not run side by side"
    cached = [set(decode_cell(c)) for c in rows["cached_stages"]]
    assert sorted("statistics" in c for c in cached) == [False, True], cached
    # Where the docs say: each job's log in its Hydra job folder, submitit's files under
    # results_dir/hydra/submitit/<slurm_job>/, the row naming both.
    sweep_dirs = list((tmp_path / "hydra" / "multirun").iterdir())
    assert len(sweep_dirs) == 1
    for _, row in rows.iterrows():
        assert re.fullmatch(r"\d+_[01]", row["slurm_job"]) and row["slurm_restarts"] == 0
        task = row["slurm_job"].split("_")[1]
        assert row["job_dir"] == str(sweep_dirs[0] / task)
        assert re.search(rf"job {row['run_id']} finished", (sweep_dirs[0] / task / "run.log").read_text())
        submitit = tmp_path / "hydra" / "submitit" / row["slurm_job"]
        logs = "".join((submitit / f"{row['slurm_job']}_0_log.{kind}").read_text() for kind in ("out", "err"))
        assert "Job completed successfully" in logs
        assert (submitit / f"{row['slurm_job']}_0_result.pkl").is_file()


def test_array_parallelism_bounds_the_jobs_running_at_once(slurm_cluster, tmp_path):
    with cluster_turn():
        proc = start_sweep(tmp_path, slurm_cluster, "alpha=0,10", "hydra.launcher.array_parallelism=1")
        code = proc.wait(timeout=SWEEP_TIMEOUT)
    console = (tmp_path / "sweep.log").read_text()
    assert code == 0, console[-3000:]
    (script,) = (tmp_path / "hydra" / "submitit").glob("*/*_submission.sh")
    assert "#SBATCH --array=0-1%1" in script.read_text()
    rows = finished_rows(tmp_path)
    (a0, a1), (b0, b1) = sorted(interval(r) for _, r in rows.iterrows())
    assert a1 <= b0, "two jobs ran at once under array_parallelism=1 (the node had room for both)"


def test_a_cancelled_job_leaves_a_failed_row_and_the_rerun_finishes_it_and_skips_the_other(slurm_cluster, tmp_path):
    env = waiting_env(slurm_cluster, tmp_path / "hooks", task=1)
    with cluster_turn():
        proc = start_sweep(tmp_path, env, "alpha=0,10")
        job = wait_for(tmp_path / "hooks" / "waiting-1", proc)
        slurm(slurm_cluster, "scancel", job)
        code = proc.wait(timeout=SWEEP_TIMEOUT)
        first = (tmp_path / "sweep.log").read_text()
        assert code != 0, first[-3000:]
        rows = ResultsStore(tmp_path).load().sort_values("alpha")
        assert list(rows["status"]) == ["finished", "failed"], first[-3000:]
        assert rows.iloc[1]["error"] == "JobInterrupted: stopped by SIGTERM"
        rerun = start_sweep(tmp_path, slurm_cluster, "alpha=0,10", log_name="rerun.log")
        code = rerun.wait(timeout=SWEEP_TIMEOUT)
    second = (tmp_path / "rerun.log").read_text()
    assert code == 0, second[-3000:]
    assert "sweep: 1 finished, 1 skipped, 0 failed" in second
    rows = ResultsStore(tmp_path).load()
    statuses = {alpha: sorted(rows[rows["alpha"] == alpha]["status"]) for alpha in (0.0, 10.0)}
    assert statuses == {0.0: ["finished"], 10.0: ["failed", "finished"]}, rows[["alpha", "status", "error"]]
    (skip,) = ResultsStore(tmp_path).load_skips().to_dict("records")
    assert skip["config_hash"] == rows[rows["alpha"] == 0.0].iloc[0]["config_hash"]


def test_a_preempted_job_is_requeued_and_ends_with_one_finished_row(slurm_cluster, tmp_path):
    """A job of the `cpu-urgent` partition takes the node's CPUs: SLURM preempts the running sweep job
    (SIGTERM: this attempt's row is failed), requeues it, and the requeued attempt finishes it; the
    sweep waits for it and exits 0. (SLURM holds a requeued job for two minutes: the test releases it.)"""
    env = waiting_env(slurm_cluster, tmp_path / "hooks", task=0)
    with cluster_turn():
        proc = start_sweep(tmp_path, env, "alpha=0")
        job = wait_for(tmp_path / "hooks" / "waiting-0", proc)
        slurm(slurm_cluster, "sbatch", "--partition=cpu-urgent", "--cpus-per-task=2", "--mem=1G",
              f"--output={tmp_path}/urgent.out", "--wrap=sleep 5")  # fmt: skip
        deadline = time.time() + 300
        requeued = ("Restarts=1", "JobState=PENDING")  # not before: the requeue would set its hold again
        while not all(s in (state := slurm(slurm_cluster, "scontrol", "show", "job", job)) for s in requeued):
            assert time.time() < deadline and proc.poll() is None, state
            time.sleep(0.5)
        slurm(slurm_cluster, "scontrol", "update", f"JobId={job}", "StartTime=now")
        code = proc.wait(timeout=SWEEP_TIMEOUT)
    console = (tmp_path / "sweep.log").read_text()
    assert code == 0, console[-3000:]
    assert "sweep: 1 finished, 0 skipped, 0 failed" in console
    rows = ResultsStore(tmp_path).load().sort_values("slurm_restarts")
    assert list(rows["status"]) == ["failed", "finished"], rows[["status", "error", "slurm_restarts"]]
    assert list(rows["slurm_restarts"]) == [0, 1] and set(rows["slurm_job"]) == {job}
    assert rows.iloc[0]["error"] == "JobInterrupted: stopped by SIGTERM"
    assert "DUE TO PREEMPTION" in (tmp_path / "hydra" / "submitit" / job / f"{job}_0_log.err").read_text()


def test_a_sweep_job_over_two_tasks_captures_on_both_and_finds_the_one_process_transform(slurm_cluster, tmp_path):
    """``hydra.launcher.tasks_per_node=2``: SLURM runs the job as two tasks (srun), which split its
    captures as two torchrun ranks do; one row, rank 0's, with the one-process job's T and distances."""
    one = run_job(tmp_path / "one", 1)
    assert one.returncode == 0, one.stderr[-2000:]
    with cluster_turn():
        proc = start_sweep(tmp_path / "two", slurm_cluster, "save_model=transform", "eval.speed.enabled=false",
                           "hydra.launcher.tasks_per_node=2")  # fmt: skip
        code = proc.wait(timeout=SWEEP_TIMEOUT)
    console = (tmp_path / "two" / "sweep.log").read_text()
    assert code == 0, console[-3000:]
    assert_same_job(tmp_path / "one", tmp_path / "two")
    (log,) = (tmp_path / "two" / "hydra" / "multirun").glob("*/0/run.log")
    assert "[rank 1/2]" in log.read_text() and "calibration captures split over 2 ranks" in log.read_text()


def test_a_cluster_whose_database_was_killed_starts_again_and_accounts_jobs(slurm_cluster, tmp_path):
    """A second cluster (own folder and ports; munged is the running cluster's): its MariaDB killed with
    SIGKILL leaves its socket behind, and the next start waits for the new server instead of connecting
    to the dead socket ("Can't connect ... (111)", as a CI run saw)."""
    folder = tmp_path / "cluster"
    env = dict(os.environ, REPLACEME_SLURM_DIR=str(folder), REPLACEME_SLURM_PORT="17917")

    def script(*args):
        return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)

    with cluster_turn():
        try:
            assert script("start").returncode == 0
            database = int((folder / "mariadb.pid").read_text())
            os.kill(database, signal.SIGKILL)
            for _ in range(60):
                if not Path(f"/proc/{database}").exists():
                    break
                time.sleep(0.5)
            assert (folder / "mysql.sock").exists()
            assert script("stop").returncode == 0
            started = script("start")
            assert started.returncode == 0, started.stderr
            accounting = subprocess.run(["sacct", "-n", "-X"], env=dict(env, SLURM_CONF=str(folder / "slurm.conf")),
                                        capture_output=True, text=True, timeout=60)  # fmt: skip
            assert accounting.returncode == 0, accounting.stderr
        finally:
            script("stop")
