"""LinearPatch (objective=linear_patch, selection=channel_cosine, healing=linearpatch_kl): the Hadamard
matrices, the channel scales and the patch against the paper's formula on brute-force hidden states,
the official selection, the hooked model against an explicit patch module, the distillation, the preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.config import compose_config
from helpers.jobs import SMOKE, job_config

from replaceme_exp.runtime import run_recorded


def value(cell):
    """A row's structured cell as Python (a JSON string in a stored row, an object in memory)."""
    return json.loads(cell) if isinstance(cell, str) else cell


@pytest.mark.slow
def test_the_linearpatch_preset_runs_end_to_end_and_saves_what_reloads_it(tmp_path):
    from replaceme_exp.runtime.export import export_checkpoint
    from replaceme_exp.surgery import load_pruned

    row = run_recorded(job_config(tmp_path, "experiment=linearpatch", "save_model=transform"))
    assert row["status"] == "finished", row["error"]
    assert row["method"] == "LinearPatch" and row["objective"] == "linear_patch"
    assert row["selection_metric"] == "channel_cosine" and row["lt_placement"] == "separate"
    assert row["plain_checkpoint"] is False
    num_layers = row["num_layers"]
    assert all(end < num_layers for _, end, _ in value(row["candidate_distances"]))  # the official candidates
    assert value(row["patch_sequences"]) == {"-".join(map(str, value(row["cuts"])[0])): 24}
    assert value(row["stage_seconds"])["capture (channel scales)"] > 0 and row["time_capture_s"] > 0
    target = export_checkpoint(tmp_path, row["config_hash"])
    assert (Path(target) / "separate_transforms.safetensors").is_file()
    reloaded = load_pruned(target).eval()
    ids = torch.randint(0, 1000, (1, 12))
    plain = type(reloaded).from_pretrained(target).eval()  # without its patch: another model
    assert not torch.allclose(reloaded(ids).logits, plain(ids).logits, atol=1e-4)
    # another results store, the same statistics cache: the channel scales are read back, the same patch
    again = run_recorded(
        compose_config(
            [*SMOKE, "experiment=linearpatch", f"results_dir={tmp_path}/again", f"capture.cache_dir={tmp_path}/stats"]
        )
    )
    assert "channel_scales" in value(again["cached_stages"]) and again["ppl_heldout"] == row["ppl_heldout"]


@pytest.mark.slow
def test_the_distillation_preset_trains_the_patch_against_the_unpruned_model(tmp_path):
    row = run_recorded(
        job_config(
            tmp_path,
            "experiment=linearpatch_distill",
            "healing/data=pydoc",
            "healing.max_steps=6",
            "healing.context_length=64",
            "healing.log_every=2",
            "save_model=false",
        )
    )
    assert row["status"] == "finished", row["error"]
    assert row["method"] == "LinearPatch + LT healing (topk_kl)"
    settings = value(row["healing_settings"])
    assert settings["loss"] == "topk_kl" and settings["optimizer"] == "adamw" and settings["lr_schedule"] == "cosine"
    assert row["healing_teacher_gb"] > 0 and row["healing_steps"] == 6
    change = value(row["healing_transform_change"])  # the patch moved (its loss falls: the integration test)
    assert list(change) == ["-".join(map(str, value(row["cuts"])[0]))] and 0 < next(iter(change.values())) < 0.1
