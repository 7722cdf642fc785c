"""The evaluation protocol: a declared metric per task, stderr and task versions from lm-eval,
every score-moving setting exposed, BOS-prefixed held-out perplexity windows."""

from __future__ import annotations

import json
import math

import pytest
from helpers.config import typed
from helpers.models import tiny_model

from replaceme_exp.evaluation.harness import declared_metrics, harness_settings, run_harness
from replaceme_exp.row_format import decode_items


@pytest.mark.slow
def test_offline_harness_returns_stderr_task_versions_and_its_settings(tmp_path, smollm2_tokenizer, monkeypatch):
    import lm_eval

    calls, real = [], lm_eval.simple_evaluate

    def spy(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(lm_eval, "simple_evaluate", spy)
    h = typed(["eval=offline", "eval.harness.limit=8", "seed=3"]).eval.harness
    model = tiny_model("llama", num_layers=2, vocab=len(smollm2_tokenizer), max_position_embeddings=1024)
    scores = run_harness(model, smollm2_tokenizer, h, tmp_path)
    # lm-eval's own seeds (the official code's), whatever the job's seed
    seeds = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")
    assert calls and all(tuple(c[k] for k in seeds) == (0, 1234, 1234, 1234) for c in calls)
    tasks = ("replaceme_world_mc", "replaceme_doc_cloze", "replaceme_doc_pairs")
    for task, metric in [*((t, "acc") for t in tasks), ("replaceme_world_mc", "acc_norm")]:
        p = scores[f"{metric}_{task}"]
        assert 0.0 <= p <= 1.0  # stderr in closed form over the 8 documents: sqrt(p(1-p)/(n-1))
        assert scores[f"{metric}_stderr_{task}"] == pytest.approx(math.sqrt(p * (1 - p) / 7))
        assert scores[f"score_{task}"] == scores[f"acc_{task}"]
    assert scores["ppl_pydoc"] > 1 and scores["score_replaceme_pydoc_ppl"] == scores["ppl_pydoc"]
    assert scores["avg_acc"] == pytest.approx(sum(scores[f"acc_{t}"] for t in tasks) / 3)
    assert scores["eval_task_versions"] == dict.fromkeys(sorted([*tasks, "replaceme_pydoc_ppl"]), 1.0)
    assert scores["eval_max_length_used"] == 512
    json.dumps(scores)  # the callers cache it as JSON
    # item by item: the declared metric of each of the 8 items, their mean the task's score
    accuracy = [t for t, m in declared_metrics(h).items() if m != "word_perplexity"]
    for task in accuracy:
        items = decode_items(scores[f"score_items_{task}"])
        assert len(items) == scores[f"n_items_{task}"] == 8 and set(items) <= {0.0, 1.0}
        assert items.mean() == pytest.approx(scores[f"score_{task}"]) and len(scores[f"items_hash_{task}"]) == 16
    assert scores["n_items_replaceme_pydoc_ppl"] == 8 and scores["avg_acc_items"] == 8 * len(accuracy)
    assert scores["avg_acc_ci_low"] <= scores["avg_acc"] <= scores["avg_acc_ci_high"]

    settings = harness_settings(h)
    assert json.loads(json.dumps(settings)) == settings
    assert settings == {
        "eval_batch_size": 8,
        "eval_add_bos_token": False,
        "eval_max_length": 512,
        "eval_fewshot": {**dict.fromkeys(tasks, 0), "replaceme_pydoc_ppl": 0},
        "eval_fewshot_seed": 1234,
        "eval_limit": 8,
        "eval_bootstrap_iters": 1000,
        "eval_metrics": {**dict.fromkeys(tasks, "acc"), "replaceme_pydoc_ppl": "word_perplexity"},
        "lm_eval_version": settings["lm_eval_version"],
        "eval_item_clusters": {"replaceme_world_mc": "answer"},
        "eval_tasks_digest": settings["eval_tasks_digest"],
    }
    assert settings["lm_eval_version"].count(".") >= 1
    assert len(settings["eval_tasks_digest"]) == 16 and paper_digest_is_none()
    paper = harness_settings(typed(["eval=paper"]).eval.harness)
    assert harness_settings(typed(["eval=paper", "eval.harness.fewshot_seed=7"]).eval.harness)["eval_fewshot_seed"] == 7
    assert "eval_max_length" in paper and paper["eval_max_length"] is None and paper["eval_limit"] is None
    assert paper["eval_metrics"]["piqa"] == "acc_norm" and paper["eval_fewshot"]["winogrande"] == 5


def paper_digest_is_none() -> bool:
    """A suite of hub tasks depends on no offline task file."""
    return harness_settings(typed(["eval=paper"]).eval.harness)["eval_tasks_digest"] is None
