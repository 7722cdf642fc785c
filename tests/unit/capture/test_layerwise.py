"""Layer-wise capture equals whole-model capture; the capture plan; float32 statistics."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.config import compose_config, config_hash, typed
from helpers.jobs import job_config
from helpers.layerwise import CPU, layerwise

from replaceme_exp.capture.execution import (
    GIB,
    CaptureExecution,
    ModelMemory,
    choose_store_layout,
    plan_execution,
    resolve_precision,
)
from replaceme_exp.errors import ConfigError
from replaceme_exp.runtime import run_recorded


def plan(overrides: list[str], **kwargs) -> CaptureExecution:
    """The capture plan of the composed config, as a job plans it (its capture, model and batches)."""
    c = typed(overrides)
    return plan_execution(c.capture, c.model, c.calibration.batch_size, c.calibration.seq_len, **kwargs)


LLAMA3_8B = ModelMemory(
    weights=16_060_522_496, largest_block=436_224_000, hidden=4096, intermediate=14336, heads=32, itemsize=2
)


def test_the_plan_takes_layerwise_when_the_weights_do_not_fit_and_says_why(caplog):
    cfg = ["capture.device=cuda", "calibration.batch_size=8", "calibration.seq_len=1024"]
    roomy = plan(cfg, memory=LLAMA3_8B, free_bytes=79 * GIB)
    assert roomy.mode == "whole" and "fit in" in roomy.reason
    activations = LLAMA3_8B.forward_activations(8, 1024)
    assert roomy.stats_bytes == pytest.approx(0.9 * 79 * GIB - LLAMA3_8B.weights - activations)
    small = plan(cfg, memory=LLAMA3_8B, free_bytes=16 * GIB)
    assert small.mode == "layerwise" and small.device == torch.device("cuda")
    assert "exceed" in small.reason and "14.96 GiB" in small.reason and "layer-wise" in small.reason
    budget = ["capture.device=cuda", "capture.max_gpu_gb=12"]
    assert plan(budget, memory=LLAMA3_8B, free_bytes=79 * GIB).mode == "layerwise"
    forced = ["capture.device=cuda", "capture.mode=whole"]
    assert plan(forced, memory=LLAMA3_8B, free_bytes=8 * GIB).mode == "whole"


def test_without_gpu_the_plan_is_whole_model_and_statistics_get_what_host_memory_leaves():
    cfg = compose_config(["capture.device=cpu"])
    cpu_plan = plan(["capture.device=cpu"], memory=LLAMA3_8B, free_bytes=64 * GIB)
    assert cpu_plan.mode == "whole" and "no GPU" in cpu_plan.reason
    activations = LLAMA3_8B.forward_activations(int(cfg.calibration.batch_size), int(cfg.calibration.seq_len))
    assert cpu_plan.stats_bytes == pytest.approx(32 * GIB - LLAMA3_8B.weights - activations)
    fixed = ["capture.device=cpu", "capture.max_stats_gb=2"]
    assert plan(fixed, memory=LLAMA3_8B, free_bytes=64 * GIB).stats_bytes == 2 * GIB


def test_store_layout_falls_back_from_the_device_to_host_memory_to_disk_in_chunks():
    hidden, kept = [GIB] * 4, [GIB // 2] * 4  # 6 GiB in all
    on_device = choose_store_layout(layerwise(max_gpu_gb=8, max_cpu_gb=100), hidden, kept)
    assert (on_device.location, on_device.chunk_batches) == ("gpu", 4)
    on_host = choose_store_layout(layerwise(max_gpu_gb=4, max_cpu_gb=8), hidden, kept)
    assert (on_host.location, on_host.chunk_batches) == ("cpu", 4) and "pinned host memory" in on_host.reason
    on_disk = choose_store_layout(layerwise(max_gpu_gb=1, max_cpu_gb=1.2), hidden, kept)
    assert (on_disk.location, on_disk.chunk_batches) == ("disk", 2) and "2 chunks of 2 batches" in on_disk.reason


def test_precision_follows_the_device_and_enters_the_config_hash(monkeypatch):
    assert resolve_precision("auto", CPU) == "float64"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))  # an L40S / RTX 4090
    assert resolve_precision("auto", torch.device("cuda")) == "float32"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    assert resolve_precision("auto", torch.device("cuda")) == "float64"
    with pytest.raises(ConfigError, match="capture.precision"):  # checked with the config, before any resolution
        typed(["capture.precision=float16"])
    base = config_hash(compose_config(["capture.device=cpu"]))
    assert config_hash(compose_config(["capture.device=cpu", "capture.precision=float64"])) == base
    assert config_hash(compose_config(["capture.device=cpu", "capture.precision=float32"])) != base
    identity = ["objective=identity", "selection=uidl", "capture.device=cpu"]
    with_float32 = compose_config([*identity, "capture.precision=float32"])
    assert config_hash(compose_config(identity)) == config_hash(with_float32)  # nothing takes products


@pytest.mark.parametrize(
    "override,message",
    [
        ("capture.mode=sideways", "capture.mode"),
        ("capture.layerwise.location=tape", "capture.layerwise.location"),
        ("capture.max_gpu_gb=-1", "capture.max_gpu_gb"),
    ],
)
def test_bad_capture_settings_are_refused_in_one_line(tmp_path, override, message, caplog):
    caplog.set_level(logging.INFO)
    row = run_recorded(job_config(tmp_path, override), raise_on_failure=False)
    assert row["status"] == "failed" and message in row["error"] and "\n" not in row["error"]


def test_blocks_moved_during_a_capture_keep_trainable_weights():
    """A capture runs in inference mode; a block moved there (to the GPU and back) must not come
    back as inference tensors, which healing could not train. A dtype move stands in for the
    device move on this CPU machine."""
    from replaceme_exp.capture.layerwise import _place

    block = torch.nn.Linear(4, 4)
    with torch.inference_mode():
        _place(block, torch.float64)
    assert block.weight.dtype == torch.float64 and not block.weight.is_inference()
