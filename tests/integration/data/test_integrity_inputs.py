"""Issue 23, the job's inputs before the model loads: the contents of a user's files (calibration
text, JSON lines, prompts, held-out and healing text, image folders) and the hub datasets a job
needs are checked when it is about to run, each problem one line naming the key, the file (and the
line) and what to do, never after the model loaded or with a traceback.

Every test runs offline on an empty Hugging Face cache of its own (deterministic, whatever the
machine has cached)."""

from __future__ import annotations

import pytest
from helpers.config import compose_config
from helpers.hub_cache import cache_hub_dataset
from helpers.integrity_inputs import hf_cache, refusal, spec
from helpers.jobs import SMOKE

from replaceme_exp.results import ResultsStore


@pytest.mark.slow
def test_a_hub_dataset_in_the_local_cache_passes_and_datasets_loads_it_offline(tmp_path, hf_cache):
    """The lookup finds what ``datasets`` finds: a prepared copy in the cache (and only that)."""
    import datasets

    assert refusal(tmp_path, "eval=sciq").value == "sciq"
    assert refusal(tmp_path, "healing=lt_only").key == "healing.data.dataset"
    cache_hub_dataset(hf_cache, "allenai/c4", "other", [{"text": "a record of another configuration"}])
    assert refusal(tmp_path, "healing=lt_only").key == "healing.data.dataset"  # en is asked for
    cache_hub_dataset(hf_cache, "allenai/c4", "en", [{"text": f"web text {i}"} for i in range(3)])
    cache_hub_dataset(hf_cache, "allenai/sciq", "default", [{"question": "q", "support": "s"}])
    spec(tmp_path, "healing=lt_only", "eval=sciq").check_inputs()
    loaded = datasets.load_dataset("allenai/c4", "en", split="train", cache_dir=str(hf_cache))
    assert [r["text"] for r in loaded] == ["web text 0", "web text 1", "web text 2"]


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["paper", "llama2_table", "leaderboard"])
def test_the_suites_datasets_are_those_lm_evals_full_task_index_gives(suite):
    from replaceme_exp.config.validate import typed_config
    from replaceme_exp.evaluation import task_datasets

    harness = typed_config(compose_config([f"eval={suite}"])).eval.harness
    found = {(d.value, d.path, d.name, d.data_files) for d in task_datasets.suite_datasets(harness)}
    index, unknown = task_datasets._full_index(task_datasets.task_roots(harness)), set()
    expected = {
        (task, c.get("dataset_path"), c.get("dataset_name"), task_datasets._data_files(c.get("dataset_kwargs")))
        for task in harness.tasks
        for c in task_datasets._leaves(task, index, unknown, set())
    }
    assert found == expected and not unknown and len(found) >= len(harness.tasks)


def test_a_job_is_refused_before_its_model_loads_and_a_finished_one_skipped_unchecked(tmp_path, monkeypatch):
    from replaceme_exp.pipeline import rules
    from replaceme_exp.runtime import run_recorded

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded for a job whose inputs are missing")

    monkeypatch.setattr("replaceme_exp.pipeline.job.load_model", never)
    cfg = compose_config([*SMOKE, f"results_dir={tmp_path}/results", "eval=paper", "save_model=false"])
    row = run_recorded(cfg, raise_on_failure=False)
    assert (row["status"], row["failed_stage"]) == ("failed", "validation")
    assert row["error"].startswith("ConfigError: eval.harness.tasks='race': reads the hub dataset EleutherAI/race")
    earlier = lambda self, chash: {"run_id": "earlier", "config_hash": chash, "status": "finished"}  # noqa: E731
    monkeypatch.setattr(ResultsStore, "finished_row", earlier)
    monkeypatch.setattr(rules, "require_available", never)
    assert run_recorded(cfg, raise_on_failure=False)["status"] == "skipped"


@pytest.mark.slow
def test_too_few_calibration_tokens_for_the_width_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    """2 samples x 16 tokens cannot determine tiny_llama's 64 x 64 transform: refused from the config
    (its hidden_size) before any weight loads, with the fit's own advice; a ridge, a diagonal T or
    enough tokens pass this check."""
    from replaceme_exp.pipeline.rules import check_shape
    from replaceme_exp.runtime import run_recorded

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded for a calibration too small for its width")

    monkeypatch.setattr("replaceme_exp.pipeline.job.load_model", never)
    few = ["calibration.n_samples=2", "calibration.seq_len=16", "objective=ls", "alpha=0", "save_model=false"]
    cfg = compose_config([*SMOKE, f"results_dir={tmp_path}/results", *few])
    row = run_recorded(cfg, raise_on_failure=False)
    assert (row["status"], row["failed_stage"]) == ("failed", "validation")
    assert row["error"] == (
        "ConfigError: calibration='2 samples x 16 tokens': at most 32 tokens: too few to determine a 64x64 "
        "transform; at least 64 are needed (raise calibration.n_samples or calibration.seq_len), or set "
        "alpha>0 (ridge)"
    )
    from replaceme_exp.models.shape import model_shape

    for more in (["alpha=1"], ["structure=diagonal"], ["calibration.n_samples=4"], ["mask_ratio=0.2", "mask_passes=1"]):
        ok = spec(tmp_path, *few, *more)
        check_shape(ok.config, model_shape(ok.config.model, tmp_path / "cache"))
