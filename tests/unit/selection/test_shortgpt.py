"""ShortGPT (``selection=shortgpt``): every block's Block Influence against the official code's
computation by hand (``output_hidden_states`` of one sequence at a time, its windows, its
``1 - cos`` summed over tokens), the removed blocks the n of lowest BI (block 0 among them when it
is lowest), and the preset's job and row."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.errors import ConfigError
from replaceme_exp.methods.shortgpt import ShortGptSelectionConfig
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.selection.search import SearchContext
from replaceme_exp.selection.shortgpt import shortgpt_search


def model_with_a_real_final_norm(seed: int = 3, num_layers: int = 6):
    """A tiny model whose final norm has its own per-channel weights (a norm of ones would leave
    every cosine as it was, and the ``final_norm`` reading untested)."""
    model = tiny_model(num_layers=num_layers, seed=seed)
    with torch.no_grad():
        weight = torch.rand(model.config.hidden_size, generator=torch.Generator().manual_seed(9)) * 2
        model.model.norm.weight.copy_(weight)
    return model


def influence_by_hand(model, sequences: list[list[int]], window: int, final_norm: bool) -> list[float]:
    """The official ``ShortGPT.eval_importance`` and ``compute_bi``: one sequence at a time, each
    window of ``window`` tokens a forward of its own with ``output_hidden_states=True``, block i's
    ``1 - cos(hidden_states[i], hidden_states[i + 1])`` summed over the window's tokens; here
    divided by the number of tokens. Without ``final_norm`` the last block's own output (a hook)."""
    num_layers = model.config.num_hidden_layers
    sums, count = [0.0] * num_layers, 0
    raw = []  # the last block's own outputs
    last = model.model.layers[-1]
    handle = last.register_forward_hook(lambda m, a, o: raw.append(o[0] if isinstance(o, tuple) else o))
    try:
        for sequence in sequences:
            for start in range(0, len(sequence), window):
                ids = torch.tensor([sequence[start : start + window]])
                hidden = list(model(input_ids=ids, output_hidden_states=True).hidden_states)
                if not final_norm:
                    hidden[-1] = raw[-1]
                for i in range(num_layers):
                    a, b = hidden[i][0].double(), hidden[i + 1][0].double()
                    cos = (a @ b.T).diagonal() / (a.norm(dim=-1) * b.norm(dim=-1))
                    sums[i] += float((1 - cos).sum())
                count += ids.shape[1]
    finally:
        handle.remove()
    return [s / count for s in sums]


@pytest.mark.parametrize("final_norm", [True, False])
def test_block_influence_equals_the_official_computation_by_hand(final_norm):
    model = model_with_a_real_final_norm()
    sequences = random_sequences(7, 3, 20, seed=4)
    calibration = batches_of(sequences, 3)  # right padding, rows of different lengths
    before = copy.deepcopy(model.state_dict())
    settings = ShortGptSelectionConfig(metric="shortgpt", window=8, final_norm=final_norm)
    result = shortgpt_search(SearchContext(adapter_for(model), calibration, 2, settings, 0))

    expected = influence_by_hand(model, sequences, 8, final_norm)
    recorded = result.columns["shortgpt_block_influence"]
    assert recorded == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert result.columns["shortgpt_tokens"] == sum(len(s) for s in sequences)
    lowest = sorted(range(len(expected)), key=lambda i: expected[i])[:2]
    assert sorted(result.removed) == sorted(lowest)
    assert result.columns["shortgpt_order"][:2] == lowest
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_final_norm_reading_moves_only_the_last_blocks_influence():
    model = model_with_a_real_final_norm()
    calibration = batches_of(random_sequences(4, 5, 12, seed=1), 2)
    adapter = adapter_for(model)
    normed, own = (
        shortgpt_search(
            SearchContext(adapter, calibration, 1, ShortGptSelectionConfig(metric="shortgpt", final_norm=flag), 0)
        ).columns["shortgpt_block_influence"]
        for flag in (True, False)
    )
    assert normed[:-1] == pytest.approx(own[:-1], rel=1e-12) and normed[-1] != pytest.approx(own[-1], rel=1e-3)


def test_block_zero_goes_when_its_influence_is_lowest():
    model = tiny_model(num_layers=5, seed=2)
    with torch.no_grad():  # block 0 adds almost nothing to the residual stream: cos(X_0, X_1) ~ 1
        model.model.layers[0].self_attn.o_proj.weight.mul_(1e-4)
        model.model.layers[0].mlp.down_proj.weight.mul_(1e-4)
    calibration = batches_of(random_sequences(4, 6, 10, seed=5), 2)
    settings = ShortGptSelectionConfig(metric="shortgpt")
    result = shortgpt_search(SearchContext(adapter_for(model), calibration, 1, settings, 0))
    assert result.removed == [0] and result.cuts == [(0, 1)]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["selection=cosine", "+selection.window=8"], r"selection\.(window|final_norm)"),
        (["selection=cosine", "selection.metric=shortgpt", "objective=identity"], r"selection\.metric"),
    ],
)
def test_a_selection_carries_its_own_metrics_keys_only(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=rf"^{key}="):
        JobSpec.from_config(job_config(tmp_path, *overrides))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["experiment=shortgpt", "objective=cosine"], "fitted from the LS statistics alone"),
        (["selection=laco", "objective=ls"], "nothing is fitted: use objective=identity"),
    ],
)
def test_only_a_removal_search_takes_a_transform_and_only_from_the_ls_statistics(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        JobSpec.from_config(job_config(tmp_path, *overrides))
