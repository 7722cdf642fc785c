"""lm-eval on the in-memory model with the project's offline tasks; baseline scores cached."""

from __future__ import annotations

import json

import pytest
from helpers.jobs import job_config

from replaceme_exp.runtime import run_recorded


# the offline suite on its first 8 items per task (all of them: tests/{unit,e2e}/evaluation/test_offline_tasks.py, e2e)
OFFLINE = ["eval=offline", "eval.seq_len=64", "eval.max_windows=4", "save_model=false", "eval.harness.limit=8"]


TASKS = ("replaceme_world_mc", "replaceme_doc_cloze", "replaceme_doc_pairs")


@pytest.mark.slow
def test_offline_suite_fills_accuracy_perplexity_and_relative_performance(tmp_path):
    first = run_recorded(job_config(tmp_path, *OFFLINE))
    assert first["status"] == "finished", first["error"]
    for column in ("acc_replaceme_world_mc", "acc_norm_replaceme_world_mc", *(f"acc_{t}" for t in TASKS[1:])):
        assert 0.0 <= first[column] <= 1.0
    assert first["ppl_pydoc"] > 1
    assert first["avg_acc"] == pytest.approx(sum(first[f"acc_{t}"] for t in TASKS) / 3)
    # eval=offline declares acc for the three tasks; each metric comes with its standard error.
    assert first["score_replaceme_world_mc"] == first["acc_replaceme_world_mc"]
    assert first["acc_stderr_replaceme_world_mc"] > 0 and first["acc_norm_stderr_replaceme_world_mc"] > 0
    assert first["eval_task_versions"]["replaceme_doc_pairs"] == 1.0
    assert first["rp"] == pytest.approx(first["avg_acc"] / first["avg_acc_baseline"])
    assert first["eval_batch_size"] == 8 and first["eval_add_bos_token"] is False
    # Every setting that moves a score is in the row (max_length was passed but not recorded before).
    assert first["eval_max_length"] == 512 and first["eval_fewshot_seed"] == 1234 and first["lm_eval_version"]
    assert first["eval_fewshot"] == {**dict.fromkeys(TASKS, 0), "replaceme_pydoc_ppl": 0}
    assert first["eval_limit"] == 8
    assert first["torch_version"] and first["transformers_version"]
    # The unpruned model's scores travel with the row (the tables' baseline rows read them).
    assert first["baseline_avg_acc"] == first["avg_acc_baseline"] and first["dtype"] == "float32"
    assert 0.0 <= first["baseline_acc_replaceme_world_mc"] <= 1.0 and first["baseline_ppl_pydoc"] > 1

    baselines = sorted((tmp_path / "baselines").glob("*.json"))
    second = run_recorded(job_config(tmp_path, *OFFLINE, "alpha=5"))
    assert second["avg_acc_baseline"] == first["avg_acc_baseline"]
    assert sorted((tmp_path / "baselines").glob("*.json")) == baselines  # nothing recomputed
    harness_baseline = [json.loads(p.read_text()) for p in baselines if "harness" in p.read_text()]
    assert len(harness_baseline) == 1 and harness_baseline[0]["value"]["avg_acc"] == first["avg_acc_baseline"]
    assert "baseline_harness" in second["cached_stages"]
    # The job's seed does not move lm-eval's scores (lm-eval's own seeds): the unpruned scores are reused.
    reseeded = run_recorded(job_config(tmp_path, *OFFLINE, "seed=7"))
    assert "baseline_harness" in reseeded["cached_stages"] and reseeded["eval_fewshot_seed"] == 1234
    # The few-shot seed moves few-shot prompts: another one gets its own unpruned scores.
    refewshot = run_recorded(job_config(tmp_path, *OFFLINE, "eval.harness.fewshot_seed=7"))
    assert "baseline_harness" not in refewshot["cached_stages"] and "baseline_ppl" in refewshot["cached_stages"]
