"""The evaluate job (``job=evaluate``): the unpruned model or a saved checkpoint through the eval suite,
one row, measured as a pruning job measures its models (the official code's ``eval_model(model_path)``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.config import compose_config, config_hash
from helpers.jobs import SMOKE, job_config

from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.job_summary import sample_lines, summary_line


@pytest.mark.slow
def test_an_evaluation_is_hashed_over_its_model_and_suite_only():
    evaluation = config_hash(compose_config([*SMOKE, "job=evaluate"]))
    for pruning_settings in (["alpha=10"], ["objective=cosine", "n_prune=3"], ["cuts=[[1,3]]", "seed=7"]):
        assert config_hash(compose_config([*SMOKE, "job=evaluate", *pruning_settings])) == evaluation
    assert config_hash(compose_config([*SMOKE, "job=evaluate", "eval.samples=null"])) == evaluation  # shown only
    for other in (["eval=offline"], ["eval.max_windows=3"], ["evaluate.dtype=bfloat16"], ["model.init_seed=1"]):
        assert config_hash(compose_config([*SMOKE, "job=evaluate", *other])) != evaluation, other
    assert config_hash(compose_config(SMOKE)) != evaluation
    assert config_hash(compose_config([*SMOKE, "job=prune"])) == config_hash(compose_config(SMOKE))
    spec = JobSpec.from_config(compose_config([*SMOKE, "job=evaluate", "evaluate.dtype=bfloat16"]))
    assert spec.setting_hash == spec.config_hash  # no seed acts
    columns = spec.setting_columns()
    assert columns["job"] == "evaluate" and columns["dtype"] == "bfloat16" and columns["eval"] == "heldout"
    assert columns["objective"] is None and columns["calibration"] is None and columns["seed"] is None
    assert JobSpec.from_config(compose_config(SMOKE)).setting_columns()["job"] == "prune"


def model_directory(root: Path, weights: bool = True, metadata: dict | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "bfloat16"}))
    if weights:
        (root / "model.safetensors").write_bytes(b"")
    if metadata is not None:
        (root / "replaceme.json").write_text(json.dumps(metadata))
    return root


def test_a_checkpoints_metadata_names_its_pruning_row_and_its_saved_dtype_is_kept(tmp_path):
    metadata = {"run_id": "r1", "config_hash": "c1", "model": "smollm2_135m", "cuts": [[12, 16]]}
    directory = model_directory(tmp_path / "ckpt", metadata=metadata)
    spec = JobSpec.from_config(compose_config([*SMOKE, "job=evaluate", f"evaluate.checkpoint={directory}"]))
    assert spec.config.model.source == "local" and spec.config.model.pretrained == str(directory)
    columns = spec.setting_columns()
    assert columns["model"] == "smollm2_135m" and columns["dtype"] == "bfloat16"  # tiny_llama's is float32
    assert columns["pruned_config_hash"] == "c1" and columns["pruned_run_id"] == "r1"
    assert columns["evaluated_checkpoint"] == str(directory) and columns["plain_checkpoint"] is True
    plain = model_directory(tmp_path / "any")  # a checkpoint this project did not save
    columns = JobSpec.from_config(
        compose_config([*SMOKE, "job=evaluate", f"evaluate.checkpoint={plain}"])
    ).setting_columns()
    assert columns["model"] == "any" and columns["pruned_config_hash"] is None


@pytest.mark.parametrize(
    "make, overrides, message",
    [
        (None, ["job=evaluate"], "no such checkpoint directory"),
        ("file", ["job=evaluate"], "is a file, not a checkpoint directory"),
        ("empty", ["job=evaluate"], "is not a model directory (no config.json)"),
        ("no_weights", ["job=evaluate"], "is not a model directory (no *.safetensors or *.bin weights)"),
        ("model", [], "is for job=evaluate (this job prunes model; add job=evaluate)"),
    ],
)
def test_a_bad_checkpoint_is_refused_in_one_line_before_loading(tmp_path, make, overrides, message):
    path = tmp_path / "checkpoint"
    if make == "file":
        path.write_text("")
    elif make == "empty":
        path.mkdir()
    elif make in ("no_weights", "model"):
        model_directory(path, weights=make == "model")
    cfg = job_config(tmp_path, *overrides, f"evaluate.checkpoint={path}")
    with pytest.raises(ConfigError) as refused:
        JobSpec.from_config(cfg)
    assert str(refused.value) == f"evaluate.checkpoint='{path}': {message}"
    row = run_recorded(cfg, raise_on_failure=False)
    assert row["status"] == "failed" and row["failed_stage"] == "validation" and message in row["error"]
    assert row["job"] == ("evaluate" if overrides else "prune")


def test_an_evaluate_jobs_summary_says_what_it_evaluated_and_its_answers():
    row = {
        "run_id": "abc",
        "status": "finished",
        "job": "evaluate",
        "model": "smollm2_135m",
        "evaluated_checkpoint": "/r/models/h",
        "cuts": [[12, 16]],
        "ppl_heldout": 34.634,
        "avg_acc": 0.84,
        "time_total_s": 12.0,
        "generation_samples": [{"prompt": "What is 2 + 2?", "answer": "4"}],
    }
    assert summary_line(row) == (
        "job abc finished, evaluated /r/models/h (cuts [12,16) of smollm2_135m), held-out ppl 34.63, "
        "avg_acc 0.840, 12 s"
    )
    unpruned = {**row, "evaluated_checkpoint": None, "cuts": float("nan")}  # as read back from the store
    assert summary_line(unpruned).startswith("job abc finished, evaluated smollm2_135m, held-out ppl 34.63,")
    assert sample_lines(row) == [
        "generation samples (greedy, chat template)",
        "  prompt: What is 2 + 2?",
        "  answer: 4",
    ]
