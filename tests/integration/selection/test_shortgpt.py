"""ShortGPT (``selection=shortgpt``): every block's Block Influence against the official code's
computation by hand (``output_hidden_states`` of one sequence at a time, its windows, its
``1 - cos`` summed over tokens), the removed blocks the n of lowest BI (block 0 among them when it
is lowest), and the preset's job and row."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.explicit import explicit_blocks
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.methods.shortgpt import ShortGptSelectionConfig
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.selection.metrics import METRICS
from replaceme_exp.selection.passes import SelectionRequest, select_and_capture


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


def weakened(model, blocks: list[int]):
    """``model`` with ``blocks`` adding almost nothing to the residual stream (their Block Influence lowest)."""
    with torch.no_grad():
        for i in blocks:
            model.model.layers[i].self_attn.o_proj.weight.mul_(1e-3)
            model.model.layers[i].mlp.down_proj.weight.mul_(1e-3)
    return model


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


@pytest.mark.slow
def test_ls_on_block_influence_cuts_is_a_method_of_its_own_and_refuses_block_zero(tmp_path):
    spec = JobSpec.from_config(job_config(tmp_path, "selection=shortgpt", "objective=ls"))
    assert spec.setting_columns()["method"] == "ReplaceMe LS on ShortGPT cuts"
    row = run_recorded(job_config(tmp_path, "selection=shortgpt", "objective=ls"), raise_on_failure=False)
    # the smoke model's block 0 has the lowest influence: no block before it to fuse a transform into
    assert row["status"] == "failed" and "removed block 0 (cut [0, 1))" in row["error"]
