"""ShortGPT (``selection=shortgpt``): every block's Block Influence against the official code's
computation by hand (``output_hidden_states`` of one sequence at a time, its windows, its
``1 - cos`` summed over tokens), the removed blocks the n of lowest BI (block 0 among them when it
is lowest), and the preset's job and row."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.explicit import explicit_blocks
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.errors import ConfigError
from replaceme_exp.methods.shortgpt import ShortGptSelectionConfig
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.selection.metrics import METRICS
from replaceme_exp.selection.passes import SelectionRequest, select_and_capture
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_block_zero_goes_when_its_influence_is_lowest():
    model = tiny_model(num_layers=5, seed=2)
    with torch.no_grad():  # block 0 adds almost nothing to the residual stream: cos(X_0, X_1) ~ 1
        model.model.layers[0].self_attn.o_proj.weight.mul_(1e-4)
        model.model.layers[0].mlp.down_proj.weight.mul_(1e-4)
    calibration = batches_of(random_sequences(4, 6, 10, seed=5), 2)
    settings = ShortGptSelectionConfig(metric="shortgpt")
    result = shortgpt_search(SearchContext(adapter_for(model), calibration, 1, settings, 0))
    assert result.removed == [0] and result.cuts == [(0, 1)]


@pytest.mark.integration
@pytest.mark.slow
def test_the_shortgpt_preset_removes_its_blocks_and_records_them(tmp_path):
    row = run_recorded(job_config(tmp_path, "experiment=shortgpt", "n_prune=2", "eval.samples=null"))
    assert row["status"] == "finished", row.get("error")
    assert row["method"] == "ShortGPT" and row["selection_metric"] == "shortgpt"
    assert row["selection_window"] == 256 and row["selection_final_norm"] is True
    assert row["selection_early_barrier"] is None
    influence, order = row["shortgpt_block_influence"], row["shortgpt_order"]
    assert len(influence) == 6 and sorted(order) == list(range(6))
    removed = sorted(order[:2])
    assert row["kept_blocks"] == [i for i in range(6) if i not in removed] and row["n_prune"] == 2
    assert row["ppl_heldout"] > 0 and row["time_capture_s"] > 0
    # the search in one capture stage of its own (SLEB's steps are stages each)
    assert row["stage_seconds"]["selection search (shortgpt)"] == pytest.approx(row["time_capture_s"], rel=1e-12)


@pytest.mark.unit
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


def weakened(model, blocks: list[int]):
    """``model`` with ``blocks`` adding almost nothing to the residual stream (their Block Influence lowest)."""
    with torch.no_grad():
        for i in blocks:
            model.model.layers[i].self_attn.o_proj.weight.mul_(1e-3)
            model.model.layers[i].mlp.down_proj.weight.mul_(1e-3)
    return model


@pytest.mark.integration
def test_a_transform_is_fitted_over_each_run_of_the_blocks_block_influence_removes():
    """Blocks 2, 3 and 5 have the lowest influence: the cuts [2,4) and [5,6), each with the LS statistics
    of M of the block before it against L_{end-1} - Y_{start-1}, by a hand-written forward pass."""
    model = weakened(tiny_model(num_layers=7, seed=4), [2, 3, 5])
    sequences = random_sequences(5, 6, 12, seed=8)
    request = SelectionRequest(
        cuts=None,
        n_prune=3,
        num_lts=1,
        merge_consecutive=True,
        metric=METRICS.get("shortgpt"),
        tokens="all",
        alpha=0.0,
        placement="fused",
        rule=TokenRule(),
        precision="float64",
        settings=ShortGptSelectionConfig(metric="shortgpt"),
    )
    cache = StatisticsCache("unused", "model", "data", enabled=False)
    selection = select_and_capture(request, adapter_for(model), batches_of(sequences, 2), cache, needs_stats=True)
    assert selection.cuts == [(2, 4), (5, 6)] and sorted(selection.stats) == [(2, 4), (5, 6)]
    assert sorted(selection.columns["shortgpt_order"][:3]) == [2, 3, 5]  # the search's own columns kept
    for (start, end), found in selection.stats.items():
        mtm, mtr = 0.0, 0.0
        for seq in sequences:
            blocks = explicit_blocks(model, torch.tensor(seq))
            m = blocks[start - 1]["M"].double()
            r = blocks[end - 1]["L"].double() - blocks[start - 1]["Y"].double()
            mtm, mtr = mtm + m.T @ m, mtr + m.T @ r
        torch.testing.assert_close(found.mtm.double(), mtm, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(found.mtr.double(), mtr, rtol=1e-4, atol=1e-5)


@pytest.mark.unit
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


@pytest.mark.integration
@pytest.mark.slow
def test_ls_on_block_influence_cuts_is_a_method_of_its_own_and_refuses_block_zero(tmp_path):
    spec = JobSpec.from_config(job_config(tmp_path, "selection=shortgpt", "objective=ls"))
    assert spec.setting_columns()["method"] == "ReplaceMe LS on ShortGPT cuts"
    row = run_recorded(job_config(tmp_path, "selection=shortgpt", "objective=ls"), raise_on_failure=False)
    # the smoke model's block 0 has the lowest influence: no block before it to fuse a transform into
    assert row["status"] == "failed" and "removed block 0 (cut [0, 1))" in row["error"]
