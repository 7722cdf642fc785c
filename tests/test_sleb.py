"""SLEB (``selection=sleb``): the greedy removal order and each step's calibration perplexity
against a brute-force loop (a deep copy of the model per candidate, the block taken out, the
calibration loss from the model's own ``labels`` loss), the barriers, the model left as it was,
and the preset's job and row."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.config.schema import SlebSelectionConfig
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.pipeline.rules import check_shape
from replaceme_exp.runtime import run_recorded
from replaceme_exp.selection.search import SearchContext
from replaceme_exp.selection.sleb import removal_losses, sleb_search


@torch.no_grad()
def calibration_nll(model, calibration) -> tuple[float, int]:
    """Summed NLL from the model's own loss: ``labels`` are the ids with padding as -100, the loss
    (a mean over the predicted tokens) times their number, batch by batch."""
    total, count = 0.0, 0
    for batch in calibration:
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        n = int((labels[:, 1:] != -100).sum())
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        total += float(loss) * n
        count += n
    return total, count


def without(model, removed: list[int]):
    """A deep copy of ``model`` with the (original) blocks ``removed`` taken out."""
    pruned = copy.deepcopy(model)
    adapter_for(pruned).keep_layers([i for i in range(model.config.num_hidden_layers) if i not in removed])
    return pruned


def greedy_by_brute_force(model, calibration, n: int, early: int, latter: int) -> tuple[list[int], list[float]]:
    """The official loop (``sleb.py``): each step every alive block but the first ``early`` and
    the last ``latter`` taken out in turn, the one of lowest loss removed (ties: the first)."""
    alive, order, ppls = list(range(model.config.num_hidden_layers)), [], []
    for _ in range(n):
        best, best_loss = None, math.inf
        for j in range(early, len(alive) - latter):
            loss, count = calibration_nll(without(model, [*order, alive[j]]), calibration)
            if loss < best_loss:
                best, best_loss = j, loss
        order.append(alive.pop(best))
        ppls.append(math.exp(best_loss / count))
    return order, ppls


@pytest.fixture(scope="module")
def model():
    return tiny_model(num_layers=6, seed=7)


@pytest.fixture(scope="module")
def calibration():
    return batches_of(random_sequences(6, 4, 16, seed=3), 4)  # right padding, rows of different lengths


@pytest.mark.unit
def test_each_candidates_loss_equals_the_model_without_that_block(model, calibration):
    adapter = adapter_for(model)
    with adapter.without_blocks([2]):  # a model already one block short: current indices 0..4
        losses, current, count = removal_losses(adapter, calibration, list(range(5)))
    expected_current, expected_count = calibration_nll(without(model, [2]), calibration)
    assert count == expected_count and current == pytest.approx(expected_current, rel=1e-5)
    for position, original in enumerate([0, 1, 3, 4, 5]):
        expected, _ = calibration_nll(without(model, [2, original]), calibration)
        assert losses[position] == pytest.approx(expected, rel=1e-5), position


@pytest.mark.unit
@pytest.mark.parametrize(("early", "latter"), [(1, 1), (0, 0)])
def test_the_greedy_order_equals_the_brute_force_loop(model, calibration, early, latter):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(input_ids=calibration.batches[0].input_ids).logits
    settings = SlebSelectionConfig(metric="sleb", early_barrier=early, latter_barrier=latter)
    result = sleb_search(SearchContext(adapter_for(model), calibration, 3, settings, 0))

    order, ppls = greedy_by_brute_force(model, calibration, 3, early, latter)
    assert result.columns["sleb_removal_order"] == order and result.removed == order
    assert result.columns["sleb_step_ppl"] == pytest.approx(ppls, rel=1e-5)
    unpruned, count = calibration_nll(model, calibration)
    assert result.columns["sleb_ppl_unpruned"] == pytest.approx(math.exp(unpruned / count), rel=1e-5)
    assert result.columns["sleb_predictions"] == count
    if early and latter:
        assert 0 not in order and 5 not in order
    # the model as it was: its blocks, indices, depth and outputs
    assert model.config.num_hidden_layers == 6 and [b.self_attn.layer_idx for b in model.model.layers] == list(range(6))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    torch.testing.assert_close(model(input_ids=calibration.batches[0].input_ids).logits, logits, rtol=0, atol=0)


@pytest.mark.integration
@pytest.mark.slow
def test_the_sleb_preset_removes_its_blocks_and_records_them(tmp_path):
    row = run_recorded(job_config(tmp_path, "experiment=sleb", "n_prune=2", "eval.samples=null"))
    assert row["status"] == "finished", row.get("error")
    assert row["method"] == "SLEB" and row["selection_metric"] == "sleb"
    assert row["selection_early_barrier"] == 1 and row["selection_latter_barrier"] == 1
    assert row["selection_window"] is None
    order = row["sleb_removal_order"]
    assert len(order) == 2 and not {0, 5} & set(order) and len(row["sleb_step_ppl"]) == 2
    assert row["kept_blocks"] == [i for i in range(6) if i not in order]
    assert row["time_capture_s"] > 0


@pytest.mark.unit
def test_the_barriers_bound_how_many_blocks_can_go(tmp_path):
    config = job_config(tmp_path, "experiment=sleb", "n_prune=5")  # 6 blocks, block 0 and block 5 stay
    with pytest.raises(ConfigError, match=r"^n_prune=5: .*at most 4 can be removed"):
        spec = JobSpec.from_config(config)
        check_shape(spec.config, model_shape(spec.config.model, spec.config.cache_dir))


@pytest.mark.unit
@pytest.mark.parametrize("method", ["shortgpt", "sleb"])
def test_a_vision_encoder_is_refused_in_one_line(tmp_path, method):
    overrides = ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", f"results_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=rf"^selection.metric='{method}': .*not for a vision encoder"):
        JobSpec.from_config(compose_config([*overrides, f"selection={method}", "objective=identity"]))
