"""W&B as a team reads it: metrics logged as they are produced, sample tables, one group per
sweep, the offline run file read back, a sync that fails fast offline and writes nothing where it
is run, and a workspace definition built without a server."""

from __future__ import annotations

import pytest
from helpers.config import compose_config
from helpers.jobs import SMOKE
from helpers.wandb_dashboards import sweep_rows

from replaceme_exp.runtime import run_recorded
from replaceme_exp.samples import publish, samples_listener
from replaceme_exp.tracking.wandb_offline import read_offline_run


@pytest.mark.slow
def test_metrics_are_logged_as_produced_and_read_back_from_the_offline_file(tmp_path):
    cfg = compose_config(
        SMOKE
        + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", "save_model=false"]
        + ["tracking.wandb.mode=offline", "tracking.codecarbon.enabled=true", "progress.mode=log"]
    )
    row = run_recorded(cfg, sweep_id="s9", sweep_name="sweep", job_dir=tmp_path / "job")
    assert row["status"] == "finished", row["error"]
    run = read_offline_run(row["wandb_dir"], wait_for_exit=60)
    assert run.run_id and run.group == "sweep s9" and run.exit_code == 0
    assert run.config["setting"]["n_prune"] == 2 and run.config["config_hash"] == row["config_hash"]

    # each stage's time and energy at its own step, as it ended
    stage_steps = [s["_step"] for s in run.history if any(k.startswith("stage/") and k.endswith("_s") for k in s)]
    assert len(stage_steps) >= 6 and stage_steps == sorted(set(stage_steps))
    assert any(k.endswith("_kwh") and v >= 0 for s in run.history for k, v in s.items() if k.startswith("stage/"))
    assert run.values("stage/pruned_perplexity_s")[0] > 0
    # the baseline perplexity when it was measured, before the pruned one, each once; not all at the end
    (baseline_step,) = run.steps_of("ppl_heldout_baseline")
    (pruned_step,) = run.steps_of("ppl_heldout")
    assert baseline_step < pruned_step < run.history[-1]["_step"]
    assert run.values("ppl_heldout") == [pytest.approx(row["ppl_heldout"])]
    assert any(k.startswith("progress/") for s in run.history for k in s)
    assert all("job/elapsed_s" in s for s in run.history)
    # the eval generation samples as a table, as in the row
    columns, data = run.table("samples/generation")
    assert columns == ["prompt", "unpruned", "pruned"]
    assert [r[0] for r in data] == [s["prompt"] for s in row["generation_samples"]]
    assert run.summary["status"] == "finished" and run.summary["ppl_heldout"] == pytest.approx(row["ppl_heldout"])


def test_a_published_sample_table_reaches_the_run(tmp_path):
    from replaceme_exp.config.schema import WandbConfig
    from replaceme_exp.tracking import WandbRun

    row = {"run_id": "r1", "config_hash": "c1", "alpha": 0.5, "status": "running", "selection_distance": None}
    tracker = WandbRun(WandbConfig(mode="offline"), {"alpha": 0.5}, row, tmp_path / "job")
    tracker.start()
    with samples_listener(tracker.samples):
        publish("calibration_generated", ["prompt", "answer"], [("Q1?", "A1"), ("Q2?", "A2")])
    row.update(selection_distance=0.25, loss_curves={"2-4": [3.0, 2.0]})
    tracker.log_new_columns()
    row["ppl_heldout"] = 12.5
    row["loss_curves"] = {"2-4": [3.0, 2.0], "5-6": [1.0]}  # a later cut: only its curve is new
    tracker.stage("pruned perplexity", 1.5, 0.001)
    tracker.finish({**row, "status": "finished"})
    run = read_offline_run(tracker.directory, wait_for_exit=60)
    assert run.values("selection_distance") == [0.25] and "alpha" not in run.history[-1]
    assert run.values("train/loss_2-4") == [3.0, 2.0] and run.values("train/loss_5-6") == [1.0]
    assert run.table("samples/calibration_generated") == (["prompt", "answer"], [["Q1?", "A1"], ["Q2?", "A2"]])
    (step,) = run.steps_of("ppl_heldout")
    assert step > run.steps_of("stage/pruned_perplexity_s")[0]
    assert run.values("stage/pruned_perplexity_kwh") == [0.001]
    assert run.config["setting"] == {"alpha": 0.5}


def test_saving_a_workspace_without_a_server_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from replaceme_exp.reporting import wandb_dashboard
    from replaceme_exp.results import ResultsStore

    store = ResultsStore(tmp_path)
    for i, row in enumerate(sweep_rows().to_dict("records")):
        store.write({**row, "run_id": f"r{i}", "config_hash": f"c{i}"})
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    args = ["--results", str(tmp_path), "--sweep", "2026-01-01_10-00-00", "--entity", "team", "--timeout", "3"]
    assert wandb_dashboard.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["could not reach the W&B server at http://127.0.0.1:9 in 3 s (Connection refused); "
                   "the workspace was not saved"]  # fmt: skip
    assert wandb_dashboard.main([*args, "--dry-run"]) == 0
    with pytest.raises(SystemExit, match="no rows of sweep 'nope'"):
        wandb_dashboard.main(["--results", str(tmp_path), "--sweep", "nope", "--dry-run"])


def test_the_models_own_calibration_answers_are_published_as_they_are_made_and_from_the_cache(tmp_path):
    from helpers.config import CACHE, typed

    from replaceme_exp.config.validate import build_option
    from replaceme_exp.data.generated import self_generated_documents
    from replaceme_exp.models import load_model

    loaded = load_model(typed(["model=tiny_llama"]).model, str(CACHE))
    option = {"name": "generated", "source": "generated", "seq_len": 256, "batch_size": 8, "n_samples": 2,
              "max_new_tokens": 3, "generation_batch_size": 1, "temperature": 0.0, "seed": 0}  # fmt: skip
    cfg = build_option("calibration", option, "calibration")
    heard = []
    for attempt in range(2):  # generated, then read from the cache
        with samples_listener(lambda *table: heard.append(table)):
            documents = self_generated_documents(cfg, loaded.tokenizer, loaded.model, loaded.identity_hash, tmp_path)
        assert len(heard) == attempt + 1
        name, columns, rows = heard[-1]
        assert name == "calibration_generated" and columns == ["prompt", "answer"] and len(rows) == 2
        assert all(prompt in doc and answer in doc for (prompt, answer), doc in zip(rows, documents))
