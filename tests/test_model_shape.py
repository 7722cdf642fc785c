"""A checkpoint's shape and parameter counts before the load, from its config and its safetensors
headers (replaceme_exp/models/shape.py, replaceme_exp/capture/execution.py): the same numbers as the
model built on the meta device, without importing the family's modeling code (the start-up's
cost; the load imports it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.config import CACHE, ROOT, compose_config
from helpers.models import tiny_model

from replaceme_exp.capture.execution import model_memory, parameter_counts
from replaceme_exp.models import adapter_for
from replaceme_exp.models.shape import meta_model, model_config, model_shape
from replaceme_exp.pipeline.spec import JobSpec


def model_cfg(*overrides):
    return JobSpec.from_config(compose_config(list(overrides))).config.model


def counted_on_meta(cfg) -> tuple[int, int]:
    """(parameters, the largest block's) of the model built on the meta device: the independent count."""
    model = meta_model(cfg, model_config(cfg, CACHE))
    blocks = adapter_for(model).layers
    return sum(p.numel() for p in model.parameters()), max(sum(p.numel() for p in b.parameters()) for b in blocks)


@pytest.mark.integration
@pytest.mark.parametrize(("model", "layers", "hidden"), [("smollm2_135m", 30, 576), ("gemma3_270m", 18, 640)])
def test_a_checkpoints_shape_and_counts_come_from_its_config_and_headers_as_on_the_meta_device(model, layers, hidden):
    cfg = model_cfg(f"model={model}")
    shape = model_shape(cfg, CACHE)
    assert shape.model is None and (shape.num_layers, shape.hidden_size) == (layers, hidden)
    assert (shape.unfusable_reason is not None) == (model == "gemma3_270m")
    assert parameter_counts(cfg, str(CACHE)) == counted_on_meta(cfg)


@pytest.mark.integration
def test_a_local_checkpoints_counts_are_its_headers(tmp_path):
    model = tiny_model("llama", num_layers=4)
    model.save_pretrained(tmp_path / "ckpt")
    cfg = model_cfg("model=smollm2_135m", "model.source=local", f"model.pretrained={tmp_path / 'ckpt'}")
    unique = {id(p): p.numel() for p in model.parameters()}
    block = sum(p.numel() for p in model.model.layers[0].parameters())
    assert parameter_counts(cfg, str(CACHE)) == (sum(unique.values()), block)
    assert model_memory(cfg, str(CACHE)).weights == sum(unique.values()) * 4  # float32
    assert model_shape(cfg, CACHE).num_layers == 4


@pytest.mark.unit
def test_random_weights_are_still_built_on_the_meta_device():
    cfg = model_cfg("debug=smoke")
    assert parameter_counts(cfg, str(CACHE)) is None
    assert model_shape(cfg, CACHE).model is not None


@pytest.mark.integration
def test_reading_the_shape_and_the_plan_imports_no_modeling_code():
    """What runs before the first stage of the default job (its shape and its capture plan's sizes)
    builds no model: neither transformers' modeling_utils nor a family's modeling module is imported
    (reading the config imports transformers' auto tables, which the load needs too)."""
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from helpers.config import compose_config
from replaceme_exp.capture.execution import model_memory
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline.spec import JobSpec
cfg = JobSpec.from_config(compose_config([])).config.model
shape, memory = model_shape(cfg, {str(CACHE)!r}), model_memory(cfg, {str(CACHE)!r})
family = lambda m: m.startswith("transformers.models.") and ".modeling_" in m and ".auto." not in m
modeling = [m for m in sys.modules if m == "transformers.modeling_utils" or family(m)]
print(json.dumps([shape.num_layers, memory.weights, sorted(modeling)]))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    layers, weights, modeling = json.loads(done.stdout.strip().splitlines()[-1])
    assert (layers, weights) == (30, 134515008 * 4) and modeling == []
