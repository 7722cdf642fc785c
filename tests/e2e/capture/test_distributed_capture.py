"""One job over several processes (issue 38): the ranks read from the environment, the statistics of a
capture split over 2 gloo processes merged into the one-process statistics, bad combinations refused
before the model loads, and ``torchrun --nproc-per-node 2 run.py`` against the same job in one
process (the same T, the same selection distances; a rank that dies fails the job with a row)."""

from __future__ import annotations

import glob

import pytest
import torch
from helpers.same_job import assert_same_job, rows_of, run_job, transforms_of

from replaceme_exp.capture import distributed


@pytest.mark.slow
def test_torchrun_two_ranks_find_the_one_process_ls_transform(tmp_path):
    one, two = run_job(tmp_path / "one", 1), run_job(tmp_path / "two", 2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert_same_job(tmp_path / "one", tmp_path / "two")
    log = two.stdout + two.stderr
    assert "[rank 1/2]" in log and "capture (selection) [rank 1/2]" in log
    assert not glob.glob(f"{tmp_path}/two/hydra/runs/*/.hydra/*rank*")
    assert glob.glob(f"{tmp_path}/two/hydra/runs/*/run_rank1.log")


@pytest.mark.slow
def test_torchrun_two_ranks_gather_the_token_store_of_a_numerical_objective(tmp_path):
    numerical = ["objective=cosine", "objective.epochs=2", "objective.lr=1e-3", "cuts=[[2,4]]"]
    one, two = run_job(tmp_path / "one", 1, *numerical), run_job(tmp_path / "two", 2, *numerical)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    (row1,), (row2,) = rows_of(tmp_path / "one"), rows_of(tmp_path / "two")
    assert row1["fit_tokens"] == row2["fit_tokens"] and row1["loss_curves"] == row2["loss_curves"]
    (t1,), (t2,) = transforms_of(tmp_path / "one").values(), transforms_of(tmp_path / "two").values()
    assert not torch.equal(t1, torch.eye(t1.shape[0], dtype=t1.dtype))  # Adam moved T
    assert float((t2 - t1).abs().max() / t1.abs().max()) < 1e-10


@pytest.mark.slow
def test_a_rank_that_dies_mid_capture_fails_the_job_with_a_row(tmp_path):
    fault = {distributed.FAULT_ENV: "1"}
    proc = run_job(tmp_path, 2, "capture.timeout_s=20", env_extra=fault, timeout=200)
    assert proc.returncode != 0
    (row,) = rows_of(tmp_path)
    assert row["status"] == "failed" and row["world_size"] == 2
    assert row["failed_stage"].startswith("capture") and "\n" not in row["error"]
    assert "SIGTERM" in row["error"] or "another rank died" in row["error"]
    assert not glob.glob(f"{tmp_path}/transforms/*")
