"""The official code's solvers and losses (ReplaceMe/utils.py): torchmin's ``minimize(..., max_iter=1)``
once per batch (``optimizing_method``), the ``nn.MSELoss(reduction="mean")`` scale, and the
``accurate=True`` forms of the losses (prediction ``X A + Z`` = M T + Y against L), each against a
hand-written copy of the official loop or formula."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_official_jobs_run_torchmin_and_an_accurate_loss_end_to_end(tmp_path):
    from helpers.jobs import job_config

    from replaceme_exp.runtime import run_recorded

    common = ["cuts=[[2,4]]", "objective.epochs=1", "save_model=false", "protocol=official"]
    row = run_recorded(job_config(tmp_path, "objective=cosine", "objective.solver=nlcg", *common))
    assert row["status"] == "finished", row["error"]
    assert (row["solver"], row["solver_schedule"], row["solver_backend"]) == ("nlcg", "minibatch", "torchmin")
    assert (row["solver_precision"], row["mse_reduction"]) == ("float32", None)
    assert row["loss_curves"]["2-4"][-1] < row["loss_curves"]["2-4"][0]
    row = run_recorded(job_config(tmp_path, "objective=elasticnet_exact", *common))
    assert row["status"] == "finished", row["error"]
    assert (row["objective"], row["solver_backend"], row["method"]) == (
        "elasticnet_exact",
        None,
        "ReplaceMe elastic net (exact)",
    )
