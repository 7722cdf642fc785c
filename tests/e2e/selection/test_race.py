"""The candidate race of the one-pass capture (replaceme_exp/selection/race.py): which candidates drop
out (against a t statistic computed here from the per-sequence distances), that the accumulators
keep no partial statistics, and that a job's selection and statistics are bit for bit those of a
capture gathering every candidate to the end, also when the selected cut had dropped out."""

from __future__ import annotations

import pytest

import replaceme_exp.estimation  # noqa: F401 - registers the ls_residual selection


@pytest.mark.slow
def test_a_jobs_row_counts_the_dropped_candidates_and_its_numbers_are_those_of_the_full_capture(tmp_path):
    from helpers.jobs import job_config

    from replaceme_exp.results.row import decode_cell
    from replaceme_exp.runtime import run_recorded

    real = ("model=smollm2_135m", "save_model=false")  # a random model's candidates are all close: none drops
    rows = {
        drop: run_recorded(job_config(tmp_path / str(drop), *real, f"capture.drop_candidates={drop}"))
        for drop in (True, False)
    }
    assert rows[True]["config_hash"] == rows[False]["config_hash"]  # a setting that changes no number
    assert rows[True]["capture_candidates_dropped"] > 0 and rows[False]["capture_candidates_dropped"] is None
    for column in ("cuts", "transform_rms", "candidate_distances", "ppl_heldout"):
        assert decode_cell(rows[True][column]) == decode_cell(rows[False][column]), column
