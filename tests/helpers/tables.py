"""Synthetic result rows for the paper's tables and the cells built from them (no jobs)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from replaceme_exp.evaluation.harness import encode_items
from replaceme_exp.intervals import perplexity_interval
from replaceme_exp.reporting.paper_tables import TABLES

SPECS = {spec.name: spec for spec in TABLES}


def run(i: int, **values) -> dict:
    """A finished Llama 3 8B run of the paper's main setting (cosine, Adam, bfloat16)."""
    row = dict(
        run_id=f"r{i}",
        config_hash=f"h{i}",
        status="finished",
        started_at=f"2026-01-01T00:00:{i:02d}",
        seed=i,
        model="llama3_8b_instruct",
        dtype="bfloat16",
        n_prune=8,
        num_layers=32,
        eval="paper",
        calibration="slimorca",
        n_calib_samples=8000,
        objective="cosine",
        solver="adam",
        solver_schedule="minibatch",
        selection_metric="cosine",
        alpha=0.0,
        regularizer="none",
        structure="generic",
        lt_placement="fused",
        mask_ratio=0.0,
        num_lts=1,
        merge_consecutive=True,
        healing="none",
    )
    row.update(values)
    return row


def frame(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def cells(table: pd.DataFrame, label: str, text: str | None = None) -> dict:
    chosen = table[table["Setting"] == label]
    if text is not None:
        chosen = chosen[chosen["Linear transform"] == text]
    assert len(chosen) == 1
    return chosen.iloc[0].to_dict()


# SmolLM2-135M-Instruct has 30 blocks: 25% is round(7.5) = 8, as the job rounds it.
SMOLLM2_BLOCKS = {"num_layers": 30, "n_prune": 8}


def smollm2_run(i: int, method: str, **values) -> dict:
    """A finished SmolLM2 run of the methods template's setting (self_generated, 128 samples,
    eval=offline, 8 of 30 blocks)."""
    base = dict(
        model="smollm2_135m",
        dtype="float32",
        calibration="self_generated",
        n_calib_samples=128,
        eval="offline",
        method=method,
        objective={"UIDL": "identity", "ReplaceMe cosine": "cosine"}.get(method, "ls"),
        solver=None,
        solver_schedule=None,
        estimation_tokens="all",
        setting_hash=f"s{i}",
        **SMOLLM2_BLOCKS,
    )
    return run(i, **{**base, **values})


TOKENS = np.full(32, 255.0)
BASE = np.random.default_rng(0).gamma(20.0, 0.15, 32) * 255  # each window's NLL: they differ by topic
TASKS = {"replaceme_capitals": "acc", "replaceme_opposites": "acc", "replaceme_pydoc_ppl": "word_perplexity"}


def measured(i: int, method: str, scale: float, right: tuple[int, int], noise: float = 0.0, **values) -> dict:
    """A SmolLM2 methods-table run whose windows' NLL are ``scale`` times the reference ones (each window
    also moved by a random ``noise`` fraction) and which gets the first ``right`` items of each task right
    (400 items each)."""
    nll = BASE * scale * (1 + noise * np.random.default_rng(i).standard_normal(32))
    low, high = perplexity_interval(nll, TOKENS)
    items = [np.r_[np.ones(n), np.zeros(400 - n)] for n in right]
    row = dict(
        ppl_heldout=float(np.exp(nll.sum() / TOKENS.sum())),
        ppl_heldout_ci_low=low,
        ppl_heldout_ci_high=high,
        ppl_heldout_window_nll=json.dumps(nll.tolist()),
        ppl_heldout_window_tokens=json.dumps(TOKENS.tolist()),
        ppl_heldout_windows_hash="w1",
        eval_metrics=json.dumps(TASKS),
        avg_acc=float(np.mean([x.mean() for x in items])),
        avg_acc_stderr=0.02,
    )
    for task, values_ in zip(("replaceme_capitals", "replaceme_opposites"), items):
        row[f"acc_{task}"] = row[f"score_{task}"] = float(values_.mean())
        row[f"acc_stderr_{task}"] = float(values_.std(ddof=1) / np.sqrt(400))
        row[f"score_items_{task}"] = encode_items(values_.tolist())
        row[f"items_hash_{task}"] = "i1"
    return smollm2_run(i, method, **{"objective": "ls", **row, **values})
