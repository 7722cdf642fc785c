"""lm-eval on the in-memory model with the project's offline tasks; baseline scores cached."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.evaluation.harness import materialize_offline_tasks, metric_column
from replaceme_exp.evaluation.perplexity import window_nll_of, window_perplexity
from replaceme_exp.runtime import run_recorded

# the offline suite on its first 8 items per task (all of them: tests/test_offline_tasks.py, e2e)
OFFLINE = ["eval=offline", "eval.seq_len=64", "eval.max_windows=4", "save_model=false", "eval.harness.limit=8"]
TASKS = ("replaceme_world_mc", "replaceme_doc_cloze", "replaceme_doc_pairs")


@pytest.mark.e2e
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


@pytest.mark.unit
def test_offline_tasks_materialize_with_absolute_paths(tmp_path):
    target = materialize_offline_tasks(tmp_path / "tasks", n_ppl_docs=3)
    yamls = {p.name: p.read_text() for p in target.glob("*.yaml")}
    # the offline tasks, and the two toy tasks of the suite before them (kept for its rows' reruns)
    assert set(yamls) == {
        f"{t}.yaml" for t in ("world_mc", "doc_cloze", "doc_pairs", "capitals", "opposites", "pydoc_ppl")
    }
    assert {p.name for p in target.glob("*.jsonl")} == {
        p.name.replace(".yaml", ".jsonl") for p in target.glob("*.yaml")
    }
    assert all(str(target) in text and "__DIR__" not in text for text in yamls.values())
    assert len((target / "pydoc_ppl.jsonl").read_text().splitlines()) == 3
    assert metric_column("piqa", "acc_norm") == "acc_norm_piqa"
    assert metric_column("lambada_openai", "perplexity", {"lambada_openai": "lambada"}) == "ppl_lambada"


@pytest.mark.integration
def test_window_perplexity_sums_each_windows_losses_as_a_per_window_forward_computes_them():
    """Against one forward per window, log-softmax gathered by hand: each window's summed NLL over its
    predicted (non-padded) tokens, in window order, and the perplexity of their totals."""
    model = tiny_model("llama", num_layers=2).eval()
    sequences = random_sequences(7, 5, 20, seed=3)
    measured = window_perplexity(model, batches_of(sequences, batch_size=3))
    expected_nll, expected_tokens = [], []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
            expected_nll.append(-float(logp.gather(1, ids[0, 1:, None]).sum()))
            expected_tokens.append(len(seq) - 1)
    np.testing.assert_allclose(measured.nll, expected_nll, rtol=1e-5)
    assert measured.tokens.tolist() == expected_tokens
    assert measured.value == pytest.approx(math.exp(sum(expected_nll) / sum(expected_tokens)), rel=1e-6)
    low, high = measured.interval()
    assert low < measured.value < high


@pytest.mark.integration
@pytest.mark.slow
def test_a_jobs_row_carries_both_perplexities_intervals_and_windows(tmp_path):
    row = run_recorded(job_config(tmp_path, "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["ppl_heldout_windows"] == 4 and row["ppl_heldout_tokens"] == sum(row["ppl_heldout_window_tokens"])
    assert row["ppl_heldout_interval"].startswith("95% percentile bootstrap over documents")
    assert row["ppl_heldout_documents"] == 4 and len(row["ppl_heldout_window_documents"]) == 4
    for name in ("ppl_heldout", "ppl_heldout_baseline"):
        nll = window_nll_of(row[f"{name}_window_nll"])
        assert len(nll) == 4
        assert row[name] == pytest.approx(math.exp(nll.sum() / row["ppl_heldout_tokens"]), rel=1e-9)
        assert row[f"{name}_ci_low"] <= row[name] <= row[f"{name}_ci_high"]
    again = run_recorded(job_config(tmp_path, "save_model=false", "alpha=3"))  # the unpruned windows from the cache
    assert "baseline_ppl" in again["cached_stages"]
    assert again["ppl_heldout_baseline_window_nll"] == row["ppl_heldout_baseline_window_nll"]
    assert again["ppl_heldout_windows_hash"] == row["ppl_heldout_windows_hash"]
