"""Held-out perplexity over many documents in two domains (eval.text=documents): the shipped documents,
their windows (none spans two documents), the cluster bootstrap over documents against one drawn cluster
by cluster, and what a row records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from replaceme_exp.intervals import perplexity_interval


@pytest.mark.slow
def test_a_job_measures_its_heldout_perplexity_on_documents_and_reports_its_interval_by_them(tmp_path):
    from helpers.jobs import job_config

    from replaceme_exp.runtime import run_recorded

    cfg = job_config(
        tmp_path,
        "eval.max_windows=8",
        "eval.seq_len=64",
    )
    row = run_recorded(cfg, sweep_id="t")
    assert row["status"] == "finished", row.get("error")
    assert row["eval_text"] == "documents" and row["ppl_heldout_documents"] == 8
    documents = row["ppl_heldout_window_documents"]
    documents = json.loads(documents) if isinstance(documents, str) else documents
    assert len(documents) == row["ppl_heldout_windows"] == 8
    nll = row["ppl_heldout_window_nll"]
    nll = np.asarray(json.loads(nll) if isinstance(nll, str) else nll)
    tokens = row["ppl_heldout_window_tokens"]
    tokens = np.asarray(json.loads(tokens) if isinstance(tokens, str) else tokens, dtype=float)
    assert row["ppl_heldout"] == pytest.approx(math.exp(nll.sum() / tokens.sum()))
    low, high = perplexity_interval(nll, tokens, clusters=documents)
    assert (row["ppl_heldout_ci_low"], row["ppl_heldout_ci_high"]) == pytest.approx((low, high))
