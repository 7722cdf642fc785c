"""SLEB (``selection=sleb``): the greedy removal order and each step's calibration perplexity
against a brute-force loop (a deep copy of the model per candidate, the block taken out, the
calibration loss from the model's own ``labels`` loss), the barriers, the model left as it was,
the preset's job and row, and its step store (a killed or deeper search takes the finished steps,
equal to a search from scratch, and counts their measured cost)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.errors import ConfigError
from replaceme_exp.methods.sleb import SlebSelectionConfig
from replaceme_exp.models import adapter_for
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.pipeline.clock import StageClock
from replaceme_exp.pipeline.rules import check_shape
from replaceme_exp.selection import sleb
from replaceme_exp.selection.search import SearchContext
from replaceme_exp.selection.search_steps import SearchSteps, StepKey
from replaceme_exp.selection.sleb import removal_losses, sleb_search
from replaceme_exp.stages import observed_by
from replaceme_exp.storage import write_keyed_json


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


def test_each_candidates_loss_equals_the_model_without_that_block(model, calibration):
    adapter = adapter_for(model)
    with adapter.without_blocks([2]):  # a model already one block short: current indices 0..4
        losses, current, count = removal_losses(adapter, calibration, list(range(5)))
    expected_current, expected_count = calibration_nll(without(model, [2]), calibration)
    assert count == expected_count and current == pytest.approx(expected_current, rel=1e-5)
    for position, original in enumerate([0, 1, 3, 4, 5]):
        expected, _ = calibration_nll(without(model, [2, original]), calibration)
        assert losses[position] == pytest.approx(expected, rel=1e-5), position


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


def test_the_barriers_bound_how_many_blocks_can_go(tmp_path):
    config = job_config(tmp_path, "experiment=sleb", "n_prune=5")  # 6 blocks, block 0 and block 5 stay
    with pytest.raises(ConfigError, match=r"^n_prune=5: .*at most 4 can be removed"):
        spec = JobSpec.from_config(config)
        check_shape(spec.config, model_shape(spec.config.model, spec.config.cache_dir))


@pytest.mark.parametrize("method", ["shortgpt", "sleb"])
def test_a_vision_encoder_is_refused_in_one_line(tmp_path, method):
    overrides = ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", f"results_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=rf"^selection.metric='{method}': .*not for a vision encoder"):
        JobSpec.from_config(compose_config([*overrides, f"selection={method}", "objective=identity"]))


class CountedLosses:
    """:func:`removal_losses` counting its calls; raising at call ``fail_at`` (a killed job)."""

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at = 0, fail_at

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt("killed")
        return removal_losses(*args)


def search(model, calibration, n: int, steps=None, early: int = 1):
    settings = SlebSelectionConfig(metric="sleb", early_barrier=early, latter_barrier=1)
    context = SearchContext(adapter_for(model), calibration, n, settings, 0, *([steps] if steps else []))
    return sleb_search(context)


def test_a_search_for_more_blocks_takes_the_steps_of_one_for_fewer_with_their_measured_cost(
    model, calibration, tmp_path, monkeypatch
):
    fresh = search(model, calibration, 3)
    steps = SearchSteps(tmp_path, "model", "data")
    clock = StageClock()
    with observed_by(clock):
        first = search(model, calibration, 2, steps)
    assert first.columns["search_steps_reused"] == 0 and "time_reused_s" not in first.columns
    counted = CountedLosses()
    monkeypatch.setattr(sleb, "removal_losses", counted)
    with observed_by(StageClock()):
        deeper = search(model, calibration, 3, steps)
    assert counted.calls == 1  # step 3 only
    assert deeper.removed == fresh.removed and deeper.columns["sleb_step_ppl"] == fresh.columns["sleb_step_ppl"]
    assert deeper.columns["sleb_ppl_unpruned"] == fresh.columns["sleb_ppl_unpruned"]
    assert deeper.columns["search_steps_reused"] == 2
    measured = [clock.labelled[f"selection search (sleb) step {k}"] for k in (1, 2)]
    assert deeper.columns["time_reused_s"] == pytest.approx(sum(measured), rel=1e-12)
    assert deeper.columns["co2_kg_reused"] is None  # no CodeCarbon measured them: unknown, not 0


def test_a_killed_search_resumes_at_its_next_step(model, calibration, tmp_path, monkeypatch):
    fresh = search(model, calibration, 3)
    steps = SearchSteps(tmp_path, "model", "data")
    monkeypatch.setattr(sleb, "removal_losses", CountedLosses(fail_at=3))
    with pytest.raises(KeyboardInterrupt):
        search(model, calibration, 3, steps)
    counted = CountedLosses()
    monkeypatch.setattr(sleb, "removal_losses", counted)
    resumed = search(model, calibration, 3, steps)
    assert counted.calls == 1 and resumed.columns["search_steps_reused"] == 2
    assert resumed.removed == fresh.removed and resumed.columns["sleb_step_ppl"] == fresh.columns["sleb_step_ppl"]


def test_steps_of_other_barriers_data_or_model_are_not_taken_and_a_corrupt_step_is_recomputed(
    model, calibration, tmp_path, monkeypatch, caplog
):
    search(model, calibration, 2, SearchSteps(tmp_path, "model", "data"))
    counted = CountedLosses()
    monkeypatch.setattr(sleb, "removal_losses", counted)
    for other in (
        SearchSteps(tmp_path, "other model", "data"),
        SearchSteps(tmp_path, "model", "other data"),
        SearchSteps(tmp_path, "model", "data", refresh=True),  # force=true
    ):
        assert search(model, calibration, 2, other).columns["search_steps_reused"] == 0
    assert (
        search(model, calibration, 2, SearchSteps(tmp_path, "model", "data"), early=0).columns["search_steps_reused"]
        == 0
    )
    assert counted.calls == 8
    fresh = search(model, calibration, 2)
    for path in tmp_path.glob("sleb-step-*.json"):
        path.write_text(path.read_text().replace("1", "2", 1))  # a flipped digit: fails its checksum
    counted.calls = 0
    again = search(model, calibration, 2, SearchSteps(tmp_path, "model", "data"))
    assert counted.calls == 2 and again.columns["search_steps_reused"] == 0 and again.removed == fresh.removed
    assert "fails its checksum" in caplog.text


def test_a_step_of_another_shape_is_recomputed_and_a_disabled_store_keeps_nothing(
    model, calibration, tmp_path, monkeypatch, caplog
):
    fresh = search(model, calibration, 2)
    steps = SearchSteps(tmp_path, "model", "data")
    search(model, calibration, 2, steps)
    first = StepKey("sleb", sleb.STEP_VERSION, {"early_barrier": 1, "latter_barrier": 1}, ())
    path, key = steps._entry(first)
    stored = json.loads(path.read_text())["value"]
    write_keyed_json(path, key, {**stored, "result": {**stored["result"], "losses": stored["result"]["losses"][:-1]}})
    counted = CountedLosses()
    monkeypatch.setattr(sleb, "removal_losses", counted)
    again = search(model, calibration, 2, steps)
    assert "holds a value of another shape" in caplog.text
    assert counted.calls == 1 and again.columns["search_steps_reused"] == 1 and again.removed == fresh.removed
    off = tmp_path / "off"
    search(model, calibration, 2, SearchSteps(off, "model", "data", enabled=False))
    assert not off.exists() and counted.calls == 3


def test_the_search_declares_its_step_version_and_the_entries_keep_their_names():
    """The step store names no search: SLEB gives its own version in each step's key. The entry's name
    is pinned, so that the steps kept by earlier jobs (evidence/draws-store) stay valid."""
    store = SearchSteps("unused", "model", "data", enabled=False)
    step = StepKey("sleb", sleb.STEP_VERSION, {"early_barrier": 1, "latter_barrier": 1}, (3,))
    assert store._entry(step)[0].name == "sleb-step-3d92572dc9540e9d86ed9ebc.json"
    assert store._entry(step)[1]["version"] == sleb.STEP_VERSION == 1
    bumped = StepKey("sleb", sleb.STEP_VERSION + 1, step.settings, step.before)
    assert store._entry(bumped)[0] != store._entry(step)[0]
