"""A selection by search (``SelectionMetric.kind == "search"``, the spine of SLEB and LaCo): the
search runs the model with blocks taken out and restores it; its removed blocks (any, block 0
too) and its new weights for kept blocks reach the surgery, the row, the saved recipe and the
export; settings that cannot act under a search are refused or dropped."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.jobs import job_config
from helpers.models import tiny_model
from helpers.selection_search import toy_metric

from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.pipeline.rules import check_shape
from replaceme_exp.selection.search import SearchResult


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


def test_a_search_result_names_its_cuts_and_refuses_what_no_surgery_can_apply():
    assert SearchResult([5, 0, 3, 4]).cuts == [(0, 1), (3, 6)]
    with pytest.raises(ValueError, match="removes"):
        SearchResult([2], {2: {}}).check(6)
    with pytest.raises(ValueError, match="removed blocks"):
        SearchResult([6]).check(6)
    with pytest.raises(ValueError, match="all 3 blocks"):
        SearchResult([0, 1, 2]).check(3)


@pytest.mark.parametrize(
    ("override", "key"),
    [("objective=ls", "objective"), ("num_lts=2", "num_lts"), ("n_prune=6", "n_prune")],
)
def test_a_search_refuses_what_cannot_act_in_one_line(tmp_path, toy_metric, override, key):
    config = job_config(tmp_path, "selection.metric=toy_search", "objective=identity", override)
    with pytest.raises(ConfigError, match=rf"^{key}="):
        spec = JobSpec.from_config(config)
        check_shape(spec.config, model_shape(spec.config.model, spec.config.cache_dir))


def test_num_lts_leaves_a_search_jobs_hash(tmp_path, toy_metric):
    base = ["selection.metric=toy_search", "objective=identity"]
    one = JobSpec.from_config(job_config(tmp_path, *base))
    assert one.effective.merge_consecutive is None and one.effective.multi_lt is None
    assert "num_lts" not in one.identity()
