"""The protocol axis (the config group ``protocol=paper|official``, conf/protocol/, and the rules of
config/protocol.py) and the official code's
settings it sets: padded positions in the statistics, a float32 capture copy, batches in the order
read with an incomplete last one dropped, touching cuts composed into one down-projection, and
sequential transforms for numerical objectives. Each is checked against an independent
computation: the official code's own arithmetic over a plain ``model(...)`` forward, or a
hand-written forward pass (tests/helpers/explicit.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.config import CACHE
from helpers.explicit import explicit_blocks
from helpers.jobs import job_config
from helpers.protocol import _without_gpu_checks
from safetensors.torch import load_file

from replaceme_exp.data.calibration import build_calibration
from replaceme_exp.models.loading import load_model
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.surgery import load_pruned


def _lstsq(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.linalg.lstsq(x.double(), y.double()).solution


def _calibration_sequences(cfg):
    spec = JobSpec.from_config(cfg)
    loaded = load_model(spec.config.model, CACHE)
    batches = build_calibration(spec.config.calibration, loaded.tokenizer)
    return loaded.model, [ids[mask.bool()] for b in batches for ids, mask in zip(b.input_ids, b.attention_mask)]


@pytest.mark.slow
def test_touching_cuts_compose_as_the_official_lstsq(tmp_path):
    """lstsq.py with merge_consecutive=false: T0 maps M_0 to L_2 - Y_0, T1 (estimated on the
    unpruned model) maps the whole L_2 to L_4, and block 0's down-projection becomes T1^T T0^T W."""
    cfg = job_config(
        tmp_path,
        "cuts=[[1,3],[3,5]]",
        "merge_consecutive=false",
        "touching_cuts=compose",
        "estimation=all",
        "save_transforms=true",
        "save_model=full",
    )
    row = run_recorded(cfg)
    model, sequences = _calibration_sequences(cfg)
    acts = [explicit_blocks(model, ids) for ids in sequences]
    m0 = torch.cat([a[0]["M"] for a in acts])
    t0 = _lstsq(m0, torch.cat([a[2]["L"] - a[0]["Y"] for a in acts]))
    t1 = _lstsq(torch.cat([a[2]["L"] for a in acts]), torch.cat([a[4]["L"] for a in acts]))
    saved = load_file(row["transforms_path"])
    torch.testing.assert_close(saved["1-3"], t0, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(saved["3-5"], t1, rtol=1e-4, atol=1e-5)
    assert row["kept_blocks"] == [0, 5] and row["touching_cuts"] == "compose"
    pruned = load_pruned(row["pruned_model_path"])
    w = model.model.layers[0].mlp.down_proj.weight.double()
    expected = (saved["3-5"].T @ saved["1-3"].T @ w).float()
    torch.testing.assert_close(pruned.model.layers[0].mlp.down_proj.weight, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_touching_cuts_estimated_sequentially_fuse_into_the_kept_block(tmp_path):
    """cosine_dist.py's order, with LS: the second cut is estimated on the model with the first
    applied, where block 0 (holding M T0) is the block before it."""
    cfg = job_config(
        tmp_path,
        "cuts=[[1,3],[3,5]]",
        "merge_consecutive=false",
        "touching_cuts=compose",
        "multi_lt=sequential",
        "estimation=all",
        "save_transforms=true",
    )
    row = run_recorded(cfg)
    model, sequences = _calibration_sequences(cfg)
    acts = [explicit_blocks(model, ids) for ids in sequences]
    t0 = _lstsq(torch.cat([a[0]["M"] for a in acts]), torch.cat([a[2]["L"] - a[0]["Y"] for a in acts]))
    applied = copy.deepcopy(model)
    down = applied.model.layers[0].mlp.down_proj
    down.weight.data = (t0.T @ down.weight.double()).float()
    applied.model.layers = torch.nn.ModuleList([applied.model.layers[0], *applied.model.layers[3:]])
    staged = [explicit_blocks(applied, ids) for ids in sequences]
    t1 = _lstsq(torch.cat([a[0]["M"] for a in staged]), torch.cat([a[2]["L"] - a[0]["Y"] for a in staged]))
    saved = load_file(row["transforms_path"])
    torch.testing.assert_close(saved["1-3"], t0, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(saved["3-5"], t1, rtol=1e-3, atol=1e-4)
    assert row["multi_lt"] == "sequential" and row["kept_blocks"] == [0, 5]


@pytest.mark.slow
def test_a_float32_capture_copy_estimates_as_a_float32_model_and_prunes_the_bfloat16_one(tmp_path):
    common = ["cuts=[[2,4]]", "estimation=all", "save_transforms=true", "eval.samples=null"]
    copy32 = run_recorded(
        job_config(tmp_path / "a", *common, "model.dtype=bfloat16", "model.capture_dtype=float32", "save_model=full")
    )
    full32 = run_recorded(job_config(tmp_path / "b", *common, "model.dtype=float32", "save_model=false"))
    bf16 = run_recorded(job_config(tmp_path / "c", *common, "model.dtype=bfloat16", "save_model=false"))
    t_copy, t_full, t_bf16 = (load_file(r["transforms_path"])["2-4"] for r in (copy32, full32, bf16))
    torch.testing.assert_close(t_copy, t_full, rtol=1e-9, atol=1e-9)  # the same float32 activations
    assert (t_bf16 - t_full).abs().max() > 1e-4  # a bfloat16 capture moves T
    assert (copy32["capture_dtype"], copy32["dtype"]) == ("float32", "bfloat16")
    assert load_pruned(copy32["pruned_model_path"]).dtype == torch.bfloat16


@pytest.mark.slow
def test_a_job_fits_its_last_cut_to_the_final_norm_and_keeps_its_own_statistics(tmp_path):
    """A cut ending at the last block under ``capture.last_state=final_norm``: T maps ``M_3`` to
    ``norm(L_5) - Y_3`` (lstsq.py's target there); the statistics of the same cut captured without
    the norm, in the same cache, are not served for it."""
    common = ["cuts=[[4,6]]", "estimation=all", "save_transforms=true", "eval.samples=null"]
    plain = run_recorded(job_config(tmp_path, *common, "capture.last_state=block_output"))
    cfg = job_config(tmp_path, *common, "capture.last_state=final_norm")
    row = run_recorded(cfg)
    model, sequences = _calibration_sequences(cfg)
    acts = [explicit_blocks(model, ids) for ids in sequences]
    with torch.no_grad():
        targets = torch.cat([model.model.norm(a[5]["L"]) - a[3]["Y"] for a in acts])
        unnormed = torch.cat([a[5]["L"] - a[3]["Y"] for a in acts])
    inputs = torch.cat([a[3]["M"] for a in acts])
    t_normed, t_plain = (load_file(r["transforms_path"])["4-6"] for r in (row, plain))
    torch.testing.assert_close(t_normed, _lstsq(inputs, targets), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(t_plain, _lstsq(inputs, unnormed), rtol=1e-4, atol=1e-5)
    assert (row["capture_last_state"], plain["capture_last_state"]) == ("final_norm", "block_output")


@pytest.mark.slow
def test_4bit_jobs_capture_each_sequential_cut_and_score_uidl_on_a_fresh_copy(monkeypatch, tmp_path):
    """The job's 4-bit paths on the tiny model, bitsandbytes stood in for by a plain reload (the glue
    only): a sequential cosine job captures each cut on its own copy of the partly pruned model, and an
    official UIDL job is scored on a copy of the truncated model, in float16, its row saying nf4."""
    from replaceme_exp.models import loading
    from replaceme_exp.pipeline import job as job_module

    _without_gpu_checks(monkeypatch)
    monkeypatch.setattr(loading, "nf4_config", lambda: None)
    copies = []

    def counted(model, dtype, device_map=None):
        copies.append((len(model.model.layers), dtype))
        return loading.nf4_copy(model, dtype, device_map)

    monkeypatch.setattr(job_module, "nf4_copy", counted)
    sequential = ["model.capture_4bit=true", "objective=cosine", "objective.epochs=1", "eval.speed.enabled=false"]
    sequential += ["cuts=[[1,2],[3,4]]", "merge_consecutive=false", "multi_lt=sequential", "calibration.n_samples=8"]
    row = run_recorded(job_config(tmp_path / "a", *sequential), raise_on_failure=True)
    assert row["status"] == "finished" and row["eval_quantisation"] is None
    assert copies == [(6, "float32"), (5, "float32")]  # the unpruned model, then with the first cut removed
    copies.clear()
    # LS: the first cut's statistics come from the selection's pass on the 4-bit copy; no second copy of it
    ls = ["model.capture_4bit=true", "objective=ls", "eval.speed.enabled=false", "cuts=[[1,2],[3,4]]"]
    ls += ["merge_consecutive=false", "multi_lt=sequential", "calibration.n_samples=8"]
    row = run_recorded(job_config(tmp_path / "ls", *ls), raise_on_failure=True)
    assert row["status"] == "finished" and copies == [(5, "float32")]
    copies.clear()
    uidl = ["protocol=official", "experiment=uidl_official", "model.capture_4bit=true", "eval=heldout", "n_prune=2"]
    uidl += ["eval.speed.enabled=false"]
    row = run_recorded(job_config(tmp_path / "b", *uidl, "calibration=pydoc", "calibration.n_samples=8"), raise_on_failure=True)
    assert row["status"] == "finished" and row["eval_quantisation"] == "nf4" and row["capture_dtype"] == "float16"
    assert copies == [(4, "float16")]
