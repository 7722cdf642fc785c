"""Issue 23, the configuration: what was accepted silently is refused in one line, what needs only the
model's config is checked before its weights load, and a user's mistake gives no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.config import ROOT
from helpers.integrity_config import no_model_loads, refused

from replaceme_exp.config import schema
from replaceme_exp.errors import ConfigError
from replaceme_exp.models.loading import load_model


def saved_tiny_checkpoint(path, tokenizer):
    from helpers.models import tiny_model

    tiny_model("llama", num_layers=6, vocab=len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return ["model=smollm2_135m", "model.source=local", f"model.pretrained={path}", "model.dtype=float32"]


def test_a_broken_local_checkpoint_is_refused_in_one_line(tmp_path, no_model_loads, smollm2_tokenizer):
    local = saved_tiny_checkpoint(tmp_path / "ckpt", smollm2_tokenizer)
    weights = tmp_path / "ckpt" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    assert "model.safetensors is truncated or not a safetensors file" in refused(tmp_path, *local)
    weights.unlink()
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "llama",')
    assert "has a config transformers cannot read" in refused(tmp_path, *local)


def test_a_checkpoint_broken_past_its_header_fails_the_load_in_one_line(tmp_path, smollm2_tokenizer):
    saved_tiny_checkpoint(tmp_path / "ckpt", smollm2_tokenizer)
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    model = schema.PretrainedModelConfig(
        name="broken", source="local", pretrained=str(tmp_path / "ckpt"), revision=None, dtype="float32", device="cpu"
    )
    with pytest.raises(ConfigError, match=r"^model.pretrained='.*': is a broken checkpoint: ") as err:
        load_model(model, tmp_path / "cache", weights={"source": "local"})
    assert "\n" not in str(err.value)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["experiment=uidl_basline"], "experiment=uidl_basline: no such option (choose one of"),
        (["+paper=structured_lts"], "paper/structured_lts is a sweep (structure=generic,diagonal,orthonormal)"),
        (["+hydra.callbacks.shared._target_=shutil.rmtree"], "hydra.callbacks.shared._target_='shutil.rmtree': only"),
        (
            ["experiment=sleb", "model=tiny_clip", "calibration=bundled_images"],
            "calibration.seq_len: set by experiment/sleb.yaml for calibration=bundled_images, which has no such key",
        ),
        (
            ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", "eval.samples={prompts:[hi]}"],
            "invalid configuration: the overrides cannot be applied",
        ),
    ],
)
@pytest.mark.slow
def test_composition_mistakes_stop_with_one_line_and_exit_2(tmp_path, args, said):
    proc = run_cli(*args, f"results_dir={tmp_path}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert said in out and "Traceback" not in out
    assert not (tmp_path / "runs").exists()  # nothing ran
