"""A selection by search (``SelectionMetric.kind == "search"``, the spine of SLEB and LaCo): the
search runs the model with blocks taken out and restores it; its removed blocks (any, block 0
too) and its new weights for kept blocks reach the surgery, the row, the saved recipe and the
export; settings that cannot act under a search are refused or dropped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.jobs import job_config
from helpers.selection_search import SCALE, toy_metric
from safetensors.torch import load_file

from replaceme_exp.models import adapter_for, load_model
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.export import export_checkpoint


@pytest.mark.slow
def test_a_search_removes_its_blocks_loads_its_weights_and_exports_the_same_checkpoint(tmp_path, toy_metric):
    overrides = ["selection.metric=toy_search", "objective=identity", "n_prune=3", "eval.samples=null"]
    light = run_recorded(job_config(tmp_path / "light", *overrides))
    full = run_recorded(job_config(tmp_path / "full", *overrides, "save_model=full"))
    assert light["status"] == full["status"] == "finished", (light.get("error"), full.get("error"))
    assert light["cuts"] == [[0, 1], [4, 6]] and light["kept_blocks"] == [1, 2, 3] and light["n_prune"] == 3
    assert light["toy_depth_inside"] == 3 and light["selection_metric"] == "toy_search" and light["method"] == "Toy"
    assert light["num_lts"] == 2 and light.get("dist_after") is None  # no L_{-1}: no held-out distances

    # the checkpoint against a hand-pruned copy of the same random model
    saved = Path(full["pruned_model_path"])
    model = tiny_model_from(tmp_path)
    adapter = adapter_for(model)
    with torch.no_grad():
        adapter.layers[1].mlp.down_proj.weight.mul_(SCALE)
    adapter.keep_layers([1, 2, 3])
    theirs = {k: v for f in saved.glob("*.safetensors") for k, v in load_file(f).items()}
    mine = model.state_dict()
    for name, tensor in theirs.items():
        torch.testing.assert_close(tensor, mine[name], rtol=0, atol=0, msg=name)

    exported = export_checkpoint(tmp_path / "light", light["config_hash"])
    again = {k: v for f in exported.glob("*.safetensors") for k, v in load_file(f).items()}
    assert again.keys() == theirs.keys()
    assert all(torch.equal(again[k], theirs[k]) for k in theirs)
    assert light["ppl_heldout"] == pytest.approx(full["ppl_heldout"], rel=1e-6)


def tiny_model_from(tmp_path):
    """The jobs' tiny_llama (random weights from its seed), built from its model group as a job builds it."""
    c = JobSpec.from_config(job_config(tmp_path / "reference")).config
    return load_model(c.model, Path(c.cache_dir), None).model
