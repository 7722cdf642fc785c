"""Calibration draws as a sweep axis (calibration.draw): another sample with every other seed kept, the
draw-th slice of records read in order, rows that say which draw, and identities (draw 0 keeps every
hash; draws share the setting hash, as seeds do)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_a_job_on_another_draw_selects_on_its_own_sample_and_says_which_draw(tmp_path):
    from helpers.jobs import job_config

    from replaceme_exp.runtime import run_recorded

    rows = [run_recorded(job_config(tmp_path, f"calibration.draw={d}"), sweep_id="t") for d in (0, 1)]
    assert all(r["status"] == "finished" for r in rows), [r.get("error") for r in rows]
    assert [r["calibration_draw"] for r in rows] == [0, 1]
    assert rows[0]["setting_hash"] == rows[1]["setting_hash"] and rows[0]["config_hash"] != rows[1]["config_hash"]
    # each draw selected on its own tokens: another sample, other token counts and selection distances
    assert rows[0]["n_calib_tokens"] != rows[1]["n_calib_tokens"]
    assert rows[0]["selection_distance"] != rows[1]["selection_distance"]
