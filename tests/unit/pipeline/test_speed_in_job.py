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


def test_speed_settings_stay_out_of_the_config_hash(tmp_path):
    base = JobSpec.from_config(job_config(tmp_path))
    for override in ("eval.speed.enabled=false", "eval.speed.rounds=9", "eval.speed.prompt_len=32"):
        other = JobSpec.from_config(job_config(tmp_path, override))
        assert other.config_hash == base.config_hash and other.setting_hash == base.setting_hash, override


def test_a_vision_encoder_refuses_speed_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^eval\.speed\.enabled=True: times prefill and decoding"):
        clip = ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", "eval.speed.enabled=true"]
        JobSpec.from_config(compose_config(clip))


def test_a_copy_that_does_not_fit_is_said_not_measured():
    model = tiny_model(num_layers=2)
    assert room_for_a_copy(model, resident_bytes(model)) is None
    problem = room_for_a_copy(model, 2**60)
    assert problem.startswith("an unpruned copy needs") and "host memory has" in problem


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
