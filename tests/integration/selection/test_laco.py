"""LaCo (selection=laco, experiment=laco): the RDSC merge against a hand-written sum over a tiny
model's blocks, the search's tries against a brute-force re-implementation of the official
notebook's loop (deep copies, merged weights, deleted layers, the model's own final hidden
states), its equal-compression stop, and the pruned job's checkpoint (plain, merged weights by
hand, export = full save)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.jobs import job_config
from helpers.laco import params
from safetensors.torch import load_file

from replaceme_exp.models import load_model
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.export import export_checkpoint


@pytest.mark.slow
def test_the_laco_checkpoint_is_plain_has_the_merged_weights_and_exports_the_same(tmp_path):
    from transformers import AutoModelForCausalLM

    # 6 blocks, C = 3, every merge kept: [3, 4] into 2, then [2, 5] into 1 (2 already merged)
    overrides = ["experiment=laco", "n_prune=4", "selection.merge_layers=3", "selection.threshold=-1"]
    overrides.append("eval.samples=null")
    light = run_recorded(job_config(tmp_path / "light", *overrides))
    full = run_recorded(job_config(tmp_path / "full", *overrides, "save_model=full"))
    assert light["status"] == full["status"] == "finished", (light.get("error"), full.get("error"))
    assert light["cuts"] == [[2, 6]] and light["kept_blocks"] == [0, 1] and light["method"] == "LaCo"
    assert light["laco_merges"] == [{"into": 1, "blocks": [2, 3, 4, 5]}] and light["laco_removed_blocks"] == 4
    assert light["stage_seconds"]["selection search (laco)"] == pytest.approx(light["time_capture_s"], rel=1e-12)
    kept_none = ["experiment=laco", "selection.threshold=0.99999", "eval.samples=null"]
    failed = run_recorded(job_config(tmp_path / "none", *kept_none), raise_on_failure=False)
    assert failed["status"] == "failed" and failed["failed_stage"] == "selection search (laco)"

    reference = JobSpec.from_config(job_config(tmp_path / "reference")).config
    original = load_model(reference.model, Path(reference.cache_dir), None).model
    t = [params(layer) for layer in original.model.layers]
    saved = Path(full["pruned_model_path"])
    loaded = AutoModelForCausalLM.from_pretrained(saved)
    assert loaded.config.num_hidden_layers == 2
    mine = params(loaded.model.layers[1])
    for name, value in mine.items():
        if name.startswith(("self_attn.", "mlp.")):
            block2 = t[2][name] + (t[3][name] - t[2][name]) + (t[4][name] - t[2][name])
            hand = t[1][name] + (block2 - t[1][name]) + (t[5][name] - t[1][name])
            torch.testing.assert_close(value, hand, rtol=1e-6, atol=1e-6, msg=name)
        else:  # the norms stay block 1's
            assert torch.equal(value, t[1][name]), name
    assert all(torch.equal(v, t[0][n]) for n, v in params(loaded.model.layers[0]).items())
    ids = torch.randint(0, loaded.config.vocab_size, (1, 5))
    assert loaded.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 8)  # KV cache re-indexed

    theirs = {k: v for f in saved.glob("*.safetensors") for k, v in load_file(f).items()}
    exported = export_checkpoint(tmp_path / "light", light["config_hash"])
    again = {k: v for f in exported.glob("*.safetensors") for k, v in load_file(f).items()}
    assert again.keys() == theirs.keys() and all(torch.equal(again[k], theirs[k]) for k in theirs)
    assert light["ppl_heldout"] == pytest.approx(full["ppl_heldout"], rel=1e-6)
