"""save_model=transform (the default): a job keeps its cuts and transforms (a few kB on the tiny
model), and the exported checkpoint equals the one save_model=full saves, bit for bit; job=evaluate
reads it; the config hash does not depend on save_model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.jobs import job_config
from safetensors.torch import load_file

from replaceme_exp.errors import ConfigError
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.export import export_checkpoint, main
from replaceme_exp.surgery import checkpoint_metadata, checkpoint_problem, recipe_path


def weights(folder: Path) -> dict:
    """Every tensor of a checkpoint folder's safetensors files, by file and name."""
    return {f"{f.name}:{k}": v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["cuts=[[2,4]]"],
        [
            "cuts=[[1,2],[3,5]]",
            "multi_lt=sequential",
            "lt_placement=separate",
            "objective=cosine",
            "objective.epochs=1",
        ],
    ],
    ids=["fused", "sequential-separate-cosine"],
)
def test_an_exported_checkpoint_equals_the_saved_one_bit_for_bit(tmp_path, overrides):
    light = run_recorded(job_config(tmp_path / "light", *overrides, "eval.samples=null"))
    full = run_recorded(job_config(tmp_path / "full", *overrides, "eval.samples=null", "save_model=full"))
    assert light["status"] == full["status"] == "finished", (light.get("error"), full.get("error"))
    chash = light["config_hash"]
    assert full["config_hash"] == chash and light["saved_model"] == "transform" and full["saved_model"] == "full"
    assert light["pruned_model_path"] is None and not (tmp_path / "light" / "models").exists()
    transforms = Path(light["transforms_path"])
    recipe = json.loads(recipe_path(transforms).read_text())
    assert recipe["cuts"] == light["cuts"] and recipe["model_fingerprint"] == light["model_fingerprint"]
    saved_bytes = transforms.stat().st_size + recipe_path(transforms).stat().st_size
    checkpoint_bytes = sum(f.stat().st_size for f in Path(full["pruned_model_path"]).iterdir())
    assert saved_bytes < checkpoint_bytes / 5

    exported = export_checkpoint(tmp_path / "light", chash)
    assert exported == tmp_path / "light" / "models" / chash and checkpoint_problem(exported) is None
    mine, theirs = weights(exported), weights(Path(full["pruned_model_path"]))
    assert mine.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert mine[name].dtype == tensor.dtype and mine[name].shape == tensor.shape, name
        assert mine[name].view(-1).view(dtype=_bits(tensor)).equal(tensor.view(-1).view(dtype=_bits(tensor))), name
    assert checkpoint_metadata(exported) == checkpoint_metadata(full["pruned_model_path"]) | {
        "run_id": light["run_id"]
    }
    if overrides == ["cuts=[[2,4]]"]:  # job=evaluate reads the exported checkpoint
        evaluated = run_recorded(
            job_config(tmp_path / "evaluate", "job=evaluate", f"evaluate.checkpoint={exported}", "eval.samples=null")
        )
        assert evaluated["status"] == "finished", evaluated.get("error")
        assert evaluated["ppl_heldout"] == pytest.approx(light["ppl_heldout"], rel=1e-5)


def _bits(tensor):
    """The integer dtype of ``tensor``'s width, to compare bit patterns (NaN == NaN, -0 != +0)."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]


def test_export_refuses_a_run_without_saved_transforms_in_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="RUN='nohash': no saved transforms to export"):
        export_checkpoint(tmp_path, "nohash")
    assert main(["nohash", "--results-dir", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("export: RUN='nohash': no saved transforms")
