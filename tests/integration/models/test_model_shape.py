"""A checkpoint's shape and parameter counts before the load, from its config and its safetensors
headers (replaceme_exp/models/shape.py, replaceme_exp/capture/execution.py): the same numbers as
transformers' config and the model built on the meta device, without importing transformers (the
start-up's cost; the load imports it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.config import CACHE, ROOT
from helpers.model_shape import model_cfg
from helpers.models import FAMILY_CONFIGS, MORE_FAMILY_CONFIGS, tiny_model

from replaceme_exp.capture.execution import model_memory, parameter_counts
from replaceme_exp.models import adapter_for
from replaceme_exp.models.adapters import adapter_class
from replaceme_exp.models.shape import meta_model, model_config, model_shape, preload_config, saved_config


def counted_on_meta(cfg) -> tuple[int, int]:
    """(parameters, the largest block's) of the model built on the meta device: the independent count."""
    model = meta_model(cfg, model_config(cfg, CACHE))
    blocks = adapter_for(model).layers
    return sum(p.numel() for p in model.parameters()), max(sum(p.numel() for p in b.parameters()) for b in blocks)


@pytest.mark.parametrize(("model", "layers", "hidden"), [("smollm2_135m", 30, 576), ("gemma3_270m", 18, 640)])
def test_a_checkpoints_shape_and_counts_come_from_its_config_and_headers_as_on_the_meta_device(model, layers, hidden):
    cfg = model_cfg(f"model={model}")
    shape = model_shape(cfg, CACHE)
    assert shape.model is None and (shape.num_layers, shape.hidden_size) == (layers, hidden)
    assert (shape.unfusable_reason is not None) == (model == "gemma3_270m")
    assert parameter_counts(cfg, str(CACHE)) == counted_on_meta(cfg)


def test_a_local_checkpoints_counts_are_its_headers(tmp_path):
    model = tiny_model("llama", num_layers=4)
    model.save_pretrained(tmp_path / "ckpt")
    cfg = model_cfg("model=smollm2_135m", "model.source=local", f"model.pretrained={tmp_path / 'ckpt'}")
    unique = {id(p): p.numel() for p in model.parameters()}
    block = sum(p.numel() for p in model.model.layers[0].parameters())
    assert parameter_counts(cfg, str(CACHE)) == (sum(unique.values()), block)
    assert model_memory(cfg, str(CACHE)).weights == sum(unique.values()) * 4  # float32
    assert model_shape(cfg, CACHE).num_layers == 4


def transformers_sizes(cfg) -> dict:
    """What the checks before the load read, from transformers' own config of ``cfg`` (the reference)."""
    config = model_config(cfg, CACHE)
    blocks = adapter_class(config).block_config(config)
    names = ("num_hidden_layers", "hidden_size", "num_attention_heads", "max_position_embeddings")
    return {name: getattr(blocks, name) for name in names}


@pytest.mark.parametrize("family", [*FAMILY_CONFIGS, *MORE_FAMILY_CONFIGS])
def test_a_saved_config_gives_the_sizes_transformers_reads(tmp_path, family):
    """Each family's checkpoint read from its config.json as saved gives the shape and the capture
    plan's sizes of transformers' config; a config.json without a field the checks read (Falcon's
    checkpoints name their MLP width ffn_hidden_size only) is read through transformers."""
    tiny_model(family, num_layers=4).save_pretrained(tmp_path / family)
    if family.startswith("falcon"):
        file = tmp_path / family / "config.json"
        file.write_text(json.dumps({k: v for k, v in json.loads(file.read_text()).items() if k != "intermediate_size"}))
    cfg = model_cfg("model=smollm2_135m", "model.source=local", f"model.pretrained={tmp_path / family}")
    ref = transformers_sizes(cfg)
    shape, memory = model_shape(cfg, CACHE), model_memory(cfg, str(CACHE))
    assert (shape.num_layers, shape.hidden_size, shape.max_positions) == (
        ref["num_hidden_layers"],
        ref["hidden_size"],
        ref["max_position_embeddings"],
    )
    assert (memory.hidden, memory.heads) == (ref["hidden_size"], ref["num_attention_heads"])
    config = model_config(cfg, CACHE)
    blocks = adapter_class(config).block_config(config)
    width = getattr(blocks, "intermediate_size", None) or getattr(blocks, "ffn_hidden_size", None)
    assert memory.intermediate == width
    assert (saved_config(cfg, CACHE) is None) == family.startswith("falcon")


def test_a_saved_config_missing_a_field_is_read_through_transformers(tmp_path):
    """A config.json that leaves max_position_embeddings to its class default (Llama's 2048) gets
    transformers' default, not a missing value."""
    tiny_model("llama", num_layers=4).save_pretrained(tmp_path / "ckpt")
    file = tmp_path / "ckpt" / "config.json"
    data = json.loads(file.read_text())
    del data["max_position_embeddings"]
    file.write_text(json.dumps(data))
    cfg = model_cfg("model=smollm2_135m", "model.source=local", f"model.pretrained={tmp_path / 'ckpt'}")
    assert saved_config(cfg, CACHE) is None
    assert hasattr(preload_config(cfg, CACHE), "to_dict")  # transformers' config
    assert model_shape(cfg, CACHE).max_positions == 2048 == transformers_sizes(cfg)["max_position_embeddings"]


@pytest.mark.parametrize(("model", "layers", "hidden"), [("smollm2_135m", 30, 576), ("gemma3_270m", 18, 640)])
@pytest.mark.slow
def test_reading_the_shape_and_the_plan_imports_no_transformers(model, layers, hidden):
    """What runs before the first stage of a job on an embedded checkpoint (its shape and its
    capture plan's sizes) imports no transformers: the load does (about 1.5 s of start-up). The
    sizes equal transformers' config's."""
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from helpers.config import compose_config
from replaceme_exp.capture.execution import model_memory
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline.spec import JobSpec
cfg = JobSpec.from_config(compose_config(["model={model}"])).config.model
shape, memory = model_shape(cfg, {str(CACHE)!r}), model_memory(cfg, {str(CACHE)!r})
imported = sorted(m for m in sys.modules if m.split(".")[0] == "transformers")
print(json.dumps([shape.num_layers, shape.hidden_size, shape.max_positions, memory.heads, imported]))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    num_layers, hidden_size, positions, heads, imported = json.loads(done.stdout.strip().splitlines()[-1])
    ref = transformers_sizes(model_cfg(f"model={model}"))
    assert (num_layers, hidden_size) == (layers, hidden) == (ref["num_hidden_layers"], ref["hidden_size"])
    assert (positions, heads) == (ref["max_position_embeddings"], ref["num_attention_heads"])
    assert imported == []
