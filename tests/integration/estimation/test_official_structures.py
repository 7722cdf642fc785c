"""The official code's other Adam-path options: the rank-1 (``two_vectors``) and lower-triangular
(``thri``) transforms and the ``elasticnet`` loss, against a hand-written copy of the official
``adam_method`` loop (ReplaceMe/utils.py) and against the formulas."""

from __future__ import annotations

import pytest
import torch
from helpers.jobs import job_config
from safetensors.torch import load_file

from replaceme_exp.runtime import run_recorded


@pytest.mark.slow
def test_a_rank1_elasticnet_job_runs_end_to_end_and_records_both(tmp_path):
    overrides = ["structure=rank1", "objective=elasticnet", "objective.epochs=2", "cuts=[[2,4]]"]
    row = run_recorded(job_config(tmp_path, *overrides, "save_model=false", "save_transforms=true"))
    assert row["status"] == "finished", row["error"]
    assert (row["structure"], row["objective"], row["solver"]) == ("rank1", "elasticnet", "adam")
    assert len(row["loss_curves"]["2-4"]) == 3 and row["loss_curves"]["2-4"][-1] < row["loss_curves"]["2-4"][0]
    t = load_file(row["transforms_path"])["2-4"]
    singular = torch.linalg.svdvals(t)
    assert singular[1] < 1e-12 * singular[0]  # a rank-1 T reached the fused model
    assert row["cos_dist_after"] != row["cos_dist_before"]
