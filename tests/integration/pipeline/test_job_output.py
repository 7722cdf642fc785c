"""What a person sees of a job: stage names, the summary line (also for a skipped job), generation
samples, a sweep's table, a quiet log, and a W&B run that exists from the job's start."""

from __future__ import annotations

import pytest
import torch
from helpers.config import CACHE, compose_config
from helpers.job_output import WANDB_ON
from helpers.jobs import job_config

from replaceme_exp.config.validate import typed_config
from replaceme_exp.runtime import run_recorded


@pytest.mark.slow
def test_generation_samples_equal_greedy_decoding_of_the_models(tmp_path):
    """The row's answers are the greedy answers of the saved pruned model and of the unpruned
    model built again from its config, decoded here with plain transformers calls."""
    from transformers import AutoModelForCausalLM

    from replaceme_exp.models import load_model

    cfg = job_config(tmp_path, "eval.samples.max_new_tokens=6", "save_model=full")
    row = run_recorded(cfg)
    assert row["status"] == "finished", row["error"]
    loaded = load_model(typed_config(cfg).model, str(CACHE))
    tokenizer = loaded.tokenizer
    pruned = AutoModelForCausalLM.from_pretrained(row["pruned_model_path"], dtype=torch.float32).eval()
    for sample in row["generation_samples"]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": sample["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        for model, answer in ((loaded.model, sample["unpruned"]), (pruned, sample["pruned"])):
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
            assert tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip() == answer


@pytest.mark.slow
def test_the_wandb_run_exists_from_the_start_and_a_midway_failure_finishes_it_as_failed(tmp_path, monkeypatch):
    """The offline run is open before evaluation starts; a job failing in its pruned-perplexity
    stage leaves a run holding run_id, config_hash, its group and status failed, and the row
    names the stage."""
    import replaceme_exp.pipeline.text as job

    cfg = compose_config(WANDB_ON + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats"])
    seen = []
    original = job.window_perplexity

    def failing_perplexity(model, windows):
        seen.append(list((tmp_path / "job" / "wandb").glob("offline-run-*/run-*.wandb")))
        if len(seen) == 1:
            return original(model, windows)  # the baseline
        raise RuntimeError("out of memory in the pruned model's pass")

    monkeypatch.setattr(job, "window_perplexity", failing_perplexity)
    row = run_recorded(cfg, job_dir=tmp_path / "job", raise_on_failure=False, sweep_name="paper/x", sweep_id="s1")
    assert row["status"] == "failed" and row["failed_stage"] == "pruned perplexity"
    assert len(seen[0]) == 1  # the run was open before the first evaluation
    (run_dir,) = (tmp_path / "job" / "wandb").glob("offline-run-*")
    assert seen[0][0].parent == run_dir
    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    for key in (row["run_id"], row["config_hash"], "paper/x s1", "failed", "out of memory"):
        assert key.encode() in data, key
    assert row["wandb_dir"] == str(run_dir)
