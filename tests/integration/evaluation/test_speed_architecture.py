"""Speed per architecture (replaceme_exp/evaluation/architecture.py): pruned models with the same
architecture share a signature and a speed figure, measured by a few jobs and then reused; analytic FLOPs
against a hand count; a table shows one figure per architecture with the spread between its jobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.models import tiny_model

from replaceme_exp.evaluation.architecture import architecture_signature
from replaceme_exp.models.adapters import adapter_for
from replaceme_exp.surgery import prune


def pruned(model, cuts, transform: bool):
    d = model.config.hidden_size
    transforms = {cut: (torch.eye(d) + 0.01 * torch.randn(d, d) if transform else None) for cut in cuts}
    prune(adapter_for(model), cuts, transforms)
    return model


def test_models_with_the_same_shapes_share_a_signature_and_others_do_not():
    base = tiny_model("llama", num_layers=6, seed=0)
    a = pruned(tiny_model("llama", num_layers=6, seed=0), [(2, 4)], transform=True)  # fused T
    b = pruned(tiny_model("llama", num_layers=6, seed=1), [(3, 5)], transform=False)  # other blocks, removal
    c = pruned(tiny_model("llama", num_layers=6, seed=0), [(2, 3)], transform=False)  # one block fewer removed
    assert architecture_signature(a) == architecture_signature(b)
    assert len({architecture_signature(x) for x in (base, a, c)}) == 3


@pytest.mark.slow
def test_jobs_measure_an_architecture_until_enough_have_then_reuse_their_figures(tmp_path):
    from helpers.jobs import job_config

    from replaceme_exp.runtime import run_recorded

    speed = ["eval.speed.enabled=true", "eval.speed.jobs_per_architecture=2"]
    rows = [run_recorded(job_config(tmp_path, f"alpha={a}", *speed), sweep_id="t") for a in (1, 2, 3)]
    assert all(r["status"] == "finished" for r in rows), [r.get("error") for r in rows]
    assert [r["speed_reused"] for r in rows] == [False, False, True]
    assert [r["speed_jobs"] for r in rows] == [1, 2, 2]
    assert len({r["speed_architecture"] for r in rows}) == 1
    measured = [r["speed_decode_b1_speedup"] for r in rows[:2]]
    assert rows[2]["speed_decode_b1_speedup"] == pytest.approx(float(np.median(measured)))
    assert (rows[2]["speed_decode_b1_speedup_min"], rows[2]["speed_decode_b1_speedup_max"]) == (
        min(measured),
        max(measured),
    )
    assert 0 < rows[0]["flops_ratio"] < 1 and rows[0]["flops_per_token"] < rows[0]["flops_per_token_baseline"]
