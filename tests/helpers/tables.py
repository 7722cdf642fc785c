"""Synthetic result rows for the paper's tables and the cells built from them (no jobs)."""

from __future__ import annotations

import pandas as pd

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
