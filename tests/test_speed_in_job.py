"""What pruning buys, in a pruning job's row (``eval.speed``: pipeline/job.py ``measure_speed``): measured
against a fresh unpruned copy, out of the config hash, refused for a vision encoder, said when the copy
does not fit."""

from __future__ import annotations

import pytest
from helpers.config import compose_config
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.errors import ConfigError
from replaceme_exp.evaluation.speed import resident_bytes, room_for_a_copy
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.runtime import run_recorded


@pytest.mark.integration
@pytest.mark.slow
def test_a_pruning_jobs_row_has_speed_memory_and_size_of_both_models(tmp_path):
    row = run_recorded(job_config(tmp_path, "save_model=false", "eval.speed.rounds=2"))
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


@pytest.mark.unit
def test_speed_settings_stay_out_of_the_config_hash(tmp_path):
    base = JobSpec.from_config(job_config(tmp_path))
    for override in ("eval.speed.enabled=false", "eval.speed.rounds=9", "eval.speed.prompt_len=32"):
        other = JobSpec.from_config(job_config(tmp_path, override))
        assert other.config_hash == base.config_hash and other.setting_hash == base.setting_hash, override


@pytest.mark.unit
def test_a_vision_encoder_refuses_speed_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^eval\.speed\.enabled=True: times prefill and decoding"):
        clip = ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", "eval.speed.enabled=true"]
        JobSpec.from_config(compose_config(clip))


@pytest.mark.unit
def test_a_copy_that_does_not_fit_is_said_not_measured():
    model = tiny_model(num_layers=2)
    assert room_for_a_copy(model, resident_bytes(model)) is None
    problem = room_for_a_copy(model, 2**60)
    assert problem.startswith("an unpruned copy needs") and "host memory has" in problem


@pytest.mark.unit
def test_the_jobs_peak_memory_is_read_before_the_speed_measurements_copy(monkeypatch):
    import torch

    from replaceme_exp.pipeline import clock as clocks

    peaks = iter([1.0, 2.0, 2.0, 5.0])  # the process's peak: 1 GB when the speed stage starts, 5 GB after
    monkeypatch.setattr(clocks, "peak_memory_gb", lambda device: next(peaks))
    clock = clocks.StageClock()
    with clock("eval"):
        pass
    with clock("speed"):  # reads (host, CUDA) peaks: 1.0, 2.0
        pass
    columns = clock.columns(torch.device("cpu"), healed=False)
    assert columns["peak_mem_gb"] == 1.0 and columns["time_speed_s"] >= 0
    monkeypatch.setattr(clocks, "peak_memory_gb", lambda device: 3.0)
    without = clocks.StageClock().columns(torch.device("cpu"), healed=False)
    assert without["peak_mem_gb"] == 3.0 and without["time_speed_s"] is None
