"""W&B as a team reads it: metrics logged as they are produced, sample tables, one group per
sweep, the offline run file read back, a sync that fails fast offline and writes nothing where it
is run, and a workspace definition built without a server."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pandas as pd
import pytest
from helpers.config import ROOT, compose_config
from helpers.jobs import SMOKE
from omegaconf import OmegaConf

from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.sweep_name import sweep_name, sweep_overrides
from replaceme_exp.samples import publish, samples_listener
from replaceme_exp.tracking.wandb_offline import read_offline_run, record_bytes


@pytest.mark.unit
def test_a_sweep_over_presets_is_one_group(tmp_path):
    """Every job of a sweep over two presets has one sweep name, so one W&B group (the row's
    ``sweep_group``); a preset the sweep does not vary still names it; a template names it first."""
    (tmp_path / "multirun.yaml").write_text(
        OmegaConf.to_yaml({"hydra": {"overrides": {"task": ["experiment=replaceme_ls,uidl_baseline", "seed=1"]}}})
    )
    swept = sweep_overrides(tmp_path)
    names = {sweep_name({"experiment": preset}, True, swept) for preset in ("replaceme_ls", "uidl_baseline")}
    assert names == {"experiment=replaceme_ls,uidl_baseline"}
    assert sweep_name({"experiment": "uidl_baseline"}, True, ["seed=1,2"]) == "experiment/uidl_baseline"
    assert sweep_name({"paper": "table1", "experiment": "x"}, True, ["experiment=a,b"]) == "paper/table1"
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "multirun.yaml").write_text(
        OmegaConf.to_yaml({"hydra": {"overrides": {"task": []}, "sweeper": {"params": {"+experiment": "a,b"}}}})
    )
    assert sweep_name({"experiment": "a"}, True, sweep_overrides(tmp_path / "t")) == "experiment=a,b"


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.unit
def test_the_reader_refuses_a_file_that_is_not_a_run_and_stops_at_a_torn_record(tmp_path):
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"not a run file")
    with pytest.raises(ValueError, match="not a W&B run file"):
        list(record_bytes(bad))
    import struct
    import zlib

    def chunk(kind: int, body: bytes) -> bytes:
        return struct.pack("<IHB", zlib.crc32(bytes([kind]) + body), len(body), kind) + body

    good = tmp_path / "run-y.wandb"
    header = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
    good.write_bytes(header + chunk(1, b"one") + chunk(2, b"tw") + chunk(4, b"o") + chunk(1, b"three")[:-2])
    assert list(record_bytes(good)) == [b"one", b"two"]


@pytest.mark.e2e
def test_sync_without_a_server_fails_in_one_line_within_its_timeout_and_writes_nothing_here(tmp_path):
    runs = tmp_path / "results" / "hydra" / "multirun" / "s1" / "0" / "wandb" / "offline-run-20260101_000000-abc"
    runs.mkdir(parents=True)
    cwd = tmp_path / "here"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_BASE_URL="http://127.0.0.1:9", WANDB_API_KEY="x" * 40, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "replaceme_exp.tracking.wandb_sync", str(tmp_path / "results"), "--timeout", "5"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert time.monotonic() - started < 30
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines == ["could not reach the W&B server at http://127.0.0.1:9 in 5 s (Connection refused); nothing synced"]
    assert "offline runs to sync: 1" in proc.stdout
    assert list(cwd.iterdir()) == []  # no wandb/ folder, nothing


def sweep_rows() -> pd.DataFrame:
    base = {"sweep_id": "2026-01-01_10-00-00", "sweep_group": "sweep 2026-01-01_10-00-00", "model": "tiny"}
    return pd.DataFrame(
        [
            {
                **base,
                "experiment": e,
                "objective": o,
                "alpha": a,
                "ppl_heldout": p,
                "ppl_heldout_baseline": 20.0,
                "status": status,
            }
            for e, o, a, p, status in [
                ("replaceme_ls", "ls", 0.0, 30.0, "finished"),
                ("uidl_baseline", "identity", 0.0, 40.0, "finished"),
                ("uidl_baseline", "identity", None, None, "failed"),
            ]  # fmt: skip
        ]
    )


@pytest.mark.unit
def test_the_workspace_of_a_sweep_selects_its_group_and_plots_what_it_varies():
    from replaceme_exp.reporting.wandb_dashboard import build_workspace, describe

    workspace = build_workspace(sweep_rows(), "team", "replaceme-exp")
    runset = workspace.runset_settings
    assert "sweep 2026-01-01_10-00-00" in str(runset.filters) and "Group" in str(runset.filters)
    assert [g.name for g in runset.groupby] == ["setting.objective"]
    sections = {s.name: s for s in workspace.sections}
    assert list(sections) == ["Quality", "As it ran", "Cost", "Samples"]
    titles = [getattr(p, "title", None) for p in sections["Quality"].panels]
    assert "ppl_heldout vs objective" in titles and "ppl_heldout_baseline vs objective" not in titles
    regexes = [p.metric_regex for p in sections["As it ran"].panels]
    assert "^stage/.*_s$" in regexes and "^progress/.*" in regexes
    assert [p.table_name for p in sections["Samples"].panels] == ["samples/calibration_generated", "samples/generation"]
    workspace._to_model()  # the view W&B would store, built without a server
    assert describe(workspace)[0] == "workspace 'ReplaceMe sweep sweep 2026-01-01_10-00-00' of team/replaceme-exp"


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sweep_over_two_method_presets_is_one_wandb_group(tmp_path):
    from helpers.jobs import run_cli

    from replaceme_exp.results import ResultsStore

    proc, _ = run_cli(["-m", *SMOKE, "experiment=replaceme_ls,uidl_baseline", "tracking.wandb.mode=offline"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = ResultsStore(tmp_path).load()
    assert (
        len(rows) == 2
        and rows["sweep_group"].nunique() == 1
        and rows["sweep_name"].iloc[0] == "experiment=replaceme_ls,uidl_baseline"
    )
    groups = {read_offline_run(d).group for d in (tmp_path / "hydra" / "multirun").glob("*/*/wandb/offline-run-*")}
    assert groups == {rows["sweep_group"].iloc[0]}
