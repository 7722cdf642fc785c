"""What pruning buys, in a pruning job's row (``eval.speed``: pipeline/job.py ``measure_speed``): measured
against a fresh unpruned copy, out of the config hash, refused for a vision encoder, said when the copy
does not fit."""

from __future__ import annotations

import pytest
from helpers.jobs import job_config

from replaceme_exp.runtime import run_recorded


@pytest.mark.slow
def test_a_pruning_jobs_row_has_speed_memory_and_size_of_both_models(tmp_path):
    row = run_recorded(job_config(tmp_path, "save_model=false", "eval.speed.enabled=true", "eval.speed.rounds=2"))
    assert row["status"] == "finished", row["error"]
    assert row["speed_rounds"] == 2 and "speed_skipped" not in row
    # the tiny model loses 2 of its 6 blocks: fewer parameters, a smaller checkpoint, than the fresh unpruned copy
    assert row["param_count_baseline"] == row["params_before"] and row["param_count"] == row["params_after"]
    assert row["checkpoint_bytes"] < row["checkpoint_bytes_baseline"] and row["peak_infer_mem_ratio"] < 1
    for metric in ("prefill", "decode_b1", "decode_batch"):
        low, high = row[f"speed_{metric}_speedup_min"], row[f"speed_{metric}_speedup_max"]
        assert low <= row[f"speed_{metric}_speedup"] <= high and row[f"speed_{metric}_tok_s"] > 0
    assert row["time_speed_s"] > 0 and "speed" not in row["cached_stages"]
    off = run_recorded(job_config(tmp_path, "save_model=false", "eval.speed.enabled=false", "force=true"))
    assert off["status"] == "finished" and not any(k.startswith("speed_") for k in off)
