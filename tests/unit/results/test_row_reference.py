"""The row-column reference (docs/row-columns.md) is generated from the code that declares a row's
columns, is current, and gives every column a job writes a meaning."""

from __future__ import annotations

import json

import pytest
from helpers.config import ROOT

from replaceme_exp.reporting.row_reference import declared_columns, meaning, render, undescribed


def test_the_row_column_reference_is_current():
    assert (ROOT / "docs" / "row-columns.md").read_text() == render(), "run make docs-reference"


def test_every_declared_column_has_a_meaning():
    assert not undescribed(), f"add them to replaceme_exp/results/columns.py: {undescribed()}"


def test_the_declared_columns_are_the_code_s():
    """Names read from start_row / refused_row and JobSpec.setting_columns, not from a list of their own."""
    declared = declared_columns()
    assert {"run_id", "config_hash", "setting_hash", "status", "run_seq", "failed_stage"} <= set(declared["identity"])
    assert {"alpha", "selection_metric", "estimation_tokens", "protocol"} <= set(declared["pruning settings"])
    assert {"evaluated_checkpoint", "pruned_config_hash", "pruned_run_id"} == set(declared["evaluate settings"])
    # a skipped job's row: its own identity and the finished run it stands for, no setting or measurement
    assert {"run_id", "sweep_id", "config_hash", "status", "finished_run_id", "job_dir"} <= set(declared["skipped job"])
    assert not set(declared["skipped job"]) & set(declared["pruning settings"])
    assert "## A skipped job's row" in render()


def test_every_column_of_the_golden_jobs_rows_has_a_meaning():
    """The measured columns are described against the rows real (tiny) jobs wrote."""
    rows = json.loads((ROOT / "tests" / "golden" / "job_results.json").read_text())
    columns = {c for row in rows.values() for c in row}
    assert len(columns) > 50
    missing = sorted(c for c in columns if meaning(c) is None)
    assert not missing, f"add them to replaceme_exp/results/columns.py: {missing}"


@pytest.mark.parametrize(
    "column, described",
    [
        ("cos_dist_after_sink", True),
        ("cos_dist_after_other", False),  # <before|after>_<sink|rest>: only those alternatives
        ("acc_norm_piqa", True),
        ("acc_norm_stderr_piqa", True),
        ("time_capture_s", True),
        ("energy_kwh_capture", True),
        ("pwcca_calibration", True),
        ("pwcca_after", False),
        ("no_such_column", False),
    ],
)
def test_patterns_match_only_what_they_name(column, described):
    assert (meaning(column) is not None) == described
