"""A selection by search (``SelectionMetric.kind == "search"``, the spine of SLEB and LaCo): the
search runs the model with blocks taken out and restores it; its removed blocks (any, block 0
too) and its new weights for kept blocks reach the surgery, the row, the saved recipe and the
export; settings that cannot act under a search are refused or dropped."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers.jobs import job_config
from helpers.models import tiny_model
from safetensors.torch import load_file

from replaceme_exp.errors import ConfigError
from replaceme_exp.methods import METHODS, Method
from replaceme_exp.models import adapter_for, load_model
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.pipeline.rules import check_shape
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.export import export_checkpoint
from replaceme_exp.selection.metrics import METRICS, SelectionMetric
from replaceme_exp.selection.search import SearchContext, SearchResult

SCALE = 0.5  # the toy search's new weight: block 1's down-projection scaled


def toy_search(context: SearchContext) -> SearchResult:
    """Removes block 0 and the last ``n_blocks - 1`` blocks; halves block 1's down-projection. It
    runs the model once with its blocks taken out, as a real search would, and records that pass's
    depth (the model it was given must be whole again afterwards)."""
    adapter = context.adapter
    num_layers = adapter.num_layers
    removed = [0, *range(num_layers - context.n_blocks + 1, num_layers)]
    with adapter.without_blocks(removed):
        depth_inside = adapter.num_layers
        batch = next(iter(context.calibration))
        adapter.forward_batch(batch, adapter.embeddings.weight.device)
    down = adapter.layers[1].mlp.down_proj.weight.detach().clone()
    return SearchResult(removed, {1: {"mlp.down_proj.weight": down * SCALE}}, {"toy_depth_inside": depth_inside})


@pytest.fixture
def toy_metric():
    METRICS.register("toy_search", SelectionMetric("toy_search", "search", search=toy_search))
    METHODS.register(
        "toy",
        Method(
            "toy", title="Toy", docs="toy.md", label=lambda job: "Toy", selections=("toy_search",), search_label="Toy"
        ),
    )
    yield "toy_search"
    METRICS._entries.pop("toy_search")
    METHODS.remove("toy")


@pytest.mark.unit
def test_without_blocks_runs_the_shorter_model_and_restores_the_whole_one():
    model = tiny_model(num_layers=6, seed=1).eval()
    adapter = adapter_for(model)
    ids = torch.randint(0, 128, (2, 12))
    before = model(ids).logits
    layers = list(adapter.layers)
    pruned = copy.deepcopy(model)
    adapter_for(pruned).keep_layers([0, 2, 3, 5])
    with adapter.without_blocks({1, 4}):
        assert adapter.num_layers == 4 and model.config.num_hidden_layers == 4
        inside = model(ids).logits
        assert [layer.self_attn.layer_idx for layer in adapter.layers] == [0, 1, 2, 3]
    torch.testing.assert_close(inside, pruned(ids).logits, rtol=0, atol=0)
    assert list(adapter.layers) == layers and model.config.num_hidden_layers == 6
    assert [layer.self_attn.layer_idx for layer in adapter.layers] == list(range(6))
    torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)


@pytest.mark.unit
def test_a_search_result_names_its_cuts_and_refuses_what_no_surgery_can_apply():
    assert SearchResult([5, 0, 3, 4]).cuts == [(0, 1), (3, 6)]
    with pytest.raises(ValueError, match="removes"):
        SearchResult([2], {2: {}}).check(6)
    with pytest.raises(ValueError, match="removed blocks"):
        SearchResult([6]).check(6)
    with pytest.raises(ValueError, match="all 3 blocks"):
        SearchResult([0, 1, 2]).check(3)


@pytest.mark.integration
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


@pytest.mark.unit
@pytest.mark.parametrize(
    ("override", "key"),
    [("objective=ls", "objective"), ("num_lts=2", "num_lts"), ("n_prune=6", "n_prune")],
)
def test_a_search_refuses_what_cannot_act_in_one_line(tmp_path, toy_metric, override, key):
    config = job_config(tmp_path, "selection.metric=toy_search", "objective=identity", override)
    with pytest.raises(ConfigError, match=rf"^{key}="):
        spec = JobSpec.from_config(config)
        check_shape(spec.config, model_shape(spec.config.model, spec.config.cache_dir))


@pytest.mark.unit
def test_num_lts_leaves_a_search_jobs_hash(tmp_path, toy_metric):
    base = ["selection.metric=toy_search", "objective=identity"]
    one = JobSpec.from_config(job_config(tmp_path, *base))
    assert one.effective.merge_consecutive is None and one.effective.multi_lt is None
    assert "num_lts" not in one.identity()
