"""The evaluate job (``job=evaluate``): the unpruned model or a saved checkpoint through the eval suite,
one row, measured as a pruning job measures its models (the official code's ``eval_model(model_path)``)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers.config import compose_config
from helpers.jobs import job_config

from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.reporting.paper_settings import finished_runs
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.job_summary import summary_line


# One short answer per model keeps the generation samples in the test at a fraction of a second.
SUITE = ["eval=offline", "eval.harness.limit=8", "eval.samples.prompts=[Hello]", "eval.samples.max_new_tokens=4"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """A tiny pruning job that saves its model (results under ``prune/``), then evaluate jobs of the
    unpruned model and of that checkpoint (results under ``evaluate/``: no cache is shared)."""
    root = tmp_path_factory.mktemp("evaluate")
    # real lm-eval, eval=offline
    pruned = run_recorded(job_config(root / "prune", "cuts=[[2,4]]", "save_model=full", *SUITE))
    unpruned_eval = run_recorded(job_config(root / "evaluate", "job=evaluate", *SUITE))
    checkpoint = pruned["pruned_model_path"]
    checkpoint_eval = run_recorded(
        job_config(root / "evaluate", "job=evaluate", f"evaluate.checkpoint={checkpoint}", *SUITE)
    )
    return {"root": root, "pruned": pruned, "unpruned_eval": unpruned_eval, "checkpoint_eval": checkpoint_eval}


@pytest.mark.slow
def test_evaluating_the_unpruned_model_gives_the_baseline_a_pruning_job_records(jobs):
    pruned, row = jobs["pruned"], jobs["unpruned_eval"]
    assert row["status"] == "finished", row["error"]
    assert row["job"] == "evaluate" and row["evaluated_checkpoint"] is None and row["model"] == "tiny_llama"
    assert row["ppl_heldout"] == pytest.approx(pruned["ppl_heldout_baseline"], rel=1e-9)
    assert row["avg_acc"] == pytest.approx(pruned["avg_acc_baseline"], abs=1e-12)  # real lm-eval, both
    assert row["ppl_pydoc"] == pytest.approx(pruned["baseline_ppl_pydoc"], rel=1e-12)
    assert row["num_layers"] == 6 and row["params"] == pruned["params_before"]
    assert row["cuts"] is None and row["pruned_config_hash"] is None
    # nothing was calibrated, selected, fitted or cut
    assert {"cuts", "n_calib_tokens", "cos_dist_before", "params_after", "selection_distance"}.isdisjoint(
        k for k, v in row.items() if v is not None
    )
    assert not {"capture", "estimate", "surgery", "data"} & set(row["stage_seconds"])


@pytest.mark.slow
def test_evaluating_a_saved_checkpoint_gives_what_the_pruning_job_measured_in_memory(jobs):
    pruned, row = jobs["pruned"], jobs["checkpoint_eval"]
    assert row["status"] == "finished", row["error"]
    # the pruning job measured the model in memory; this job loaded it from disk
    assert row["ppl_heldout"] == pytest.approx(pruned["ppl_heldout"], rel=1e-6)
    assert row["ppl_heldout"] != pytest.approx(jobs["unpruned_eval"]["ppl_heldout"], rel=1e-3)
    assert row["avg_acc"] == pytest.approx(pruned["avg_acc"], abs=1e-12)
    assert row["ppl_pydoc"] == pytest.approx(pruned["ppl_pydoc"], rel=1e-12)  # the same weights
    assert row["evaluated_checkpoint"] == pruned["pruned_model_path"] and row["model"] == "tiny_llama"
    assert row["pruned_config_hash"] == pruned["config_hash"] and row["pruned_run_id"] == pruned["run_id"]
    assert row["cuts"] == [[2, 4]] and row["kept_blocks"] == pruned["kept_blocks"] == [0, 1, 4, 5]
    assert row["num_layers"] == 4 and row["params"] == pruned["params_after"]
    assert row["plain_checkpoint"] is True and row["dtype"] == "float32"  # the dtype it was saved in
    assert row["model_fingerprint"]["source"] == "local" and "sha256" in row["model_fingerprint"]
    assert [s["prompt"] for s in row["generation_samples"]] == ["Hello"]


@pytest.mark.slow
def test_an_evaluate_row_has_the_pruned_models_score_and_suite_columns(jobs):
    pruned, row = jobs["pruned"], jobs["checkpoint_eval"]
    pruning_only = {"rp", "ppl_heldout_baseline", "avg_acc_baseline", "compression_ratio"}
    scores = {k for k in pruned if k.startswith(("ppl_", "acc_", "score_", "avg_acc", "eval_"))}
    scores = {k for k in scores - pruning_only if not k.startswith(("baseline_", "ppl_heldout_baseline"))}
    assert scores and scores <= set(row)
    for key in scores:
        if isinstance(pruned[key], float):
            assert row[key] == pytest.approx(pruned[key], rel=1e-6), key
        else:
            assert json.dumps(row[key], default=str) == json.dumps(pruned[key], default=str), key
    stored = ResultsStore(jobs["root"] / "evaluate").load()
    assert sorted(stored["job"]) == ["evaluate", "evaluate"] and set(stored["status"]) == {"finished"}
    assert sorted(stored["num_layers"]) == [4, 6]
    # the paper's tables average pruning runs only
    both = pd.concat([ResultsStore(jobs["root"] / "prune").load(), stored], ignore_index=True)
    assert list(finished_runs(both)["job"]) == ["prune"]


@pytest.mark.slow
def test_a_finished_evaluation_is_skipped_and_force_runs_it_again(jobs, caplog):
    results, first = jobs["root"] / "evaluate", jobs["unpruned_eval"]
    with caplog.at_level("DEBUG"):
        again = run_recorded(job_config(results, "job=evaluate", *SUITE))
    assert again["status"] == "skipped" and again["run_id"] == first["run_id"] and "skipping" in caplog.text
    assert summary_line(again).startswith(f"job skipped: finished before as run {first['run_id']}")
    # another spelling of the same evaluation: pruning settings do not act
    same = run_recorded(job_config(results, "job=evaluate", "alpha=10", "n_prune=3", "calibration=pydoc_chat", *SUITE))
    assert same["status"] == "skipped" and same["run_id"] == first["run_id"]
    forced = run_recorded(job_config(results, "job=evaluate", "force=true", *SUITE))
    assert forced["status"] == "finished" and forced["run_id"] != first["run_id"]
    assert forced["config_hash"] == first["config_hash"] and forced["ppl_heldout"] == first["ppl_heldout"]
    assert len(ResultsStore(results).rows_for(first["config_hash"])) == 2


@pytest.mark.slow
def test_a_checkpoint_with_separate_transforms_is_evaluated_with_them(tmp_path):
    from transformers import AutoModelForCausalLM

    from replaceme_exp.data.calibration import heldout_windows
    from replaceme_exp.evaluation.perplexity import perplexity
    from replaceme_exp.models.loading import load_tokenizer

    pruned = run_recorded(
        job_config(tmp_path / "prune", "cuts=[[2,4]]", "lt_placement=separate", "eval.samples=null", "save_model=full")
    )
    assert pruned["status"] == "finished", pruned["error"]
    assert pruned["plain_checkpoint"] is False
    path = pruned["pruned_model_path"]
    overrides = ["job=evaluate", f"evaluate.checkpoint={path}", "eval.samples=null"]
    row = run_recorded(job_config(tmp_path / "evaluate", *overrides))
    assert row["status"] == "finished", row["error"]
    assert row["plain_checkpoint"] is False
    assert row["ppl_heldout"] == pytest.approx(pruned["ppl_heldout"], rel=1e-6)
    # the transforms were re-attached: without them the same weights measure another perplexity (the
    # random model's is near its vocabulary size whatever it does, so the difference is small, 6e-4)
    spec = JobSpec.from_config(job_config(tmp_path / "evaluate", *overrides))
    windows = heldout_windows(spec.config.eval, load_tokenizer(spec.config.model, tmp_path))
    bare = perplexity(AutoModelForCausalLM.from_pretrained(path).eval(), windows)
    assert bare != pytest.approx(row["ppl_heldout"], rel=1e-4)


@pytest.mark.slow
def test_a_saved_clip_checkpoint_is_evaluated_on_the_image_benchmarks(tmp_path):
    clip = [
        "model=tiny_clip",
        "calibration=bundled_images",
        "calibration.n_samples=48",
        "eval=clip_offline",
        "n_prune=2",
        "tracking.wandb.mode=disabled",
        "tracking.codecarbon.enabled=false",
        f"capture.cache_dir={tmp_path}/stats",
    ]
    pruned = run_recorded(compose_config([*clip, f"results_dir={tmp_path}/prune", "save_model=full"]))
    assert pruned["status"] == "finished", pruned["error"]
    evaluate = [*clip, f"results_dir={tmp_path}/evaluate", "job=evaluate"]
    row = run_recorded(compose_config([*evaluate, f"evaluate.checkpoint={pruned['pruned_model_path']}"]))
    assert row["status"] == "finished", row["error"]
    assert row["model"] == "tiny_clip" and row["num_layers"] == 6 and row["cuts"] == pruned["cuts"]
    unpruned = run_recorded(compose_config(evaluate))
    assert unpruned["status"] == "finished" and unpruned["num_layers"] == 8
    benchmarks = [k for k in pruned if k.startswith(("acc1_", "acc5_", "text_recall5_", "vision_recall5_"))]
    assert len(benchmarks) == 4
    for key in benchmarks:
        assert row[key] == pytest.approx(pruned[key]), key
        assert unpruned[key] == pytest.approx(pruned[f"baseline_{key}"]), key
    assert row["eval_benchmarks"] == pruned["eval_benchmarks"]
