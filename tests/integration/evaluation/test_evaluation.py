"""lm-eval on the in-memory model with the project's offline tasks; baseline scores cached."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.evaluation.perplexity import window_perplexity
from replaceme_exp.row_format import window_nll_of
from replaceme_exp.runtime import run_recorded


def test_window_perplexity_sums_each_windows_losses_as_a_per_window_forward_computes_them():
    """Against one forward per window, log-softmax gathered by hand: each window's summed NLL over its
    predicted (non-padded) tokens, in window order, and the perplexity of their totals."""
    model = tiny_model("llama", num_layers=2).eval()
    sequences = random_sequences(7, 5, 20, seed=3)
    measured = window_perplexity(model, batches_of(sequences, batch_size=3))
    expected_nll, expected_tokens = [], []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
            expected_nll.append(-float(logp.gather(1, ids[0, 1:, None]).sum()))
            expected_tokens.append(len(seq) - 1)
    np.testing.assert_allclose(measured.nll, expected_nll, rtol=1e-5)
    assert measured.tokens.tolist() == expected_tokens
    assert measured.value == pytest.approx(math.exp(sum(expected_nll) / sum(expected_tokens)), rel=1e-6)
    low, high = measured.interval()
    assert low < measured.value < high


@pytest.mark.slow
def test_a_jobs_row_carries_both_perplexities_intervals_and_windows(tmp_path):
    row = run_recorded(job_config(tmp_path, "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["ppl_heldout_windows"] == 4 and row["ppl_heldout_tokens"] == sum(row["ppl_heldout_window_tokens"])
    assert row["ppl_heldout_interval"].startswith("95% percentile bootstrap over documents")
    assert row["ppl_heldout_documents"] == 4 and len(row["ppl_heldout_window_documents"]) == 4
    for name in ("ppl_heldout", "ppl_heldout_baseline"):
        nll = window_nll_of(row[f"{name}_window_nll"])
        assert len(nll) == 4
        assert row[name] == pytest.approx(math.exp(nll.sum() / row["ppl_heldout_tokens"]), rel=1e-9)
        assert row[f"{name}_ci_low"] <= row[name] <= row[f"{name}_ci_high"]
    again = run_recorded(job_config(tmp_path, "save_model=false", "alpha=3"))  # the unpruned windows from the cache
    assert "baseline_ppl" in again["cached_stages"]
    assert again["ppl_heldout_baseline_window_nll"] == row["ppl_heldout_baseline_window_nll"]
    assert again["ppl_heldout_windows_hash"] == row["ppl_heldout_windows_hash"]
