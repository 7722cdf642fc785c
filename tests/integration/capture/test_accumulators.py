"""Statistics declared by the components that need them (:mod:`replaceme_exp.capture.accumulator`): the
worked example of docs/extending/statistic.md, a method needing a statistic the core never collected (each
sublayer's input against its output), is its page's one Python file and one YAML, and its numbers equal a
hand computation; an accumulator's state goes through the statistics cache and back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.explicit import explicit_blocks
from helpers.jobs import job_config
from helpers.accumulators import sublayer_cosine

from replaceme_exp.config.validate import typed_config
from replaceme_exp.data import build_calibration
from replaceme_exp.models import load_model
from replaceme_exp.runtime import run_recorded


@pytest.mark.slow
def test_a_method_needing_a_new_statistic_is_one_file_and_one_yaml_and_its_distances_are_the_hand_computed_ones(
    tmp_path, sublayer_cosine
):
    _, searchpath = sublayer_cosine
    cfg = job_config(tmp_path, searchpath, "selection=sublayer_cosine", "objective=identity", "save_model=false")
    row = run_recorded(cfg)
    assert row["status"] == "finished", row["error"]
    assert row["method"] == "Sublayer cosine" and row["selection_metric"] == "sublayer_cosine"

    typed = typed_config(cfg)
    loaded = load_model(typed.model, typed.cache_dir)
    cos_sums, n = None, 0
    for batch in build_calibration(typed.calibration, loaded.tokenizer):
        for ids, mask in zip(batch.input_ids, batch.attention_mask):
            blocks = explicit_blocks(loaded.model, ids[mask.bool()])
            # per block: cos(attention's input X, its output Y), cos(the MLP's input Y, its output L)
            per_token = torch.stack(
                [
                    torch.stack([F.cosine_similarity(b["X"], b["Y"], dim=-1), F.cosine_similarity(b["Y"], b["L"], dim=-1)])
                    for b in blocks
                ]
            ).double()  # (blocks, 2, seq)
            cos_sums = per_token.sum(-1) if cos_sums is None else cos_sums + per_token.sum(-1)
            n += int(mask.sum())
    block_similarity = (cos_sums / n).mean(-1)  # both sublayers, (blocks,)
    hand = {(s, e): 1.0 - float(block_similarity[s:e].mean()) for s, e, _ in row["candidate_distances"]}
    for s, e, distance in row["candidate_distances"]:
        assert distance == pytest.approx(hand[(s, e)], abs=2e-5), (s, e)
    assert row["cuts"] == [list(min(hand, key=hand.get))]
    assert len({round(d, 4) for d in hand.values()}) > 1  # the candidates differ: the choice means something
