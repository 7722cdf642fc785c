"""Jobs and sweeps: config composition, rows, skipping finished jobs, failed rows, caches."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers.config import CACHE, ROOT, compose_config, config_hash
from helpers.jobs import SMOKE, job_config, run_cli
from omegaconf import OmegaConf

from replaceme_exp.config.validate import typed_config
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded

# What the debug=smoke preset stands for, spelled out as overrides (the tests' tiny job before the preset).
SMOKE_SPELLED_OUT = [
    "model=tiny_llama",
    "calibration=pydoc",  # the default job's self-generated chats have their own tests
    "n_prune=2",
    "calibration.n_samples=24",
    "calibration.seq_len=64",
    "eval.seq_len=64",
    "eval.max_windows=4",
    # Tracking has its own tests (test_tracking.py); here it would only cost time.
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
]

REQUIRED_COLUMNS = (
    "run_id sweep_id config_hash status error model num_layers calibration n_calib_samples calib_seq_len objective "
    "regularizer alpha num_lts n_prune cuts compression_ratio params_before params_after cos_dist_before "
    "cos_dist_after ppl_heldout ppl_heldout_baseline time_capture_s time_estimate_s time_eval_s peak_mem_gb device "
    "pruned_model_path dtype healing l2_dist_before"
).split()


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model=llama3_70b_instruct", "calibration=slimorca_fineweb"],
        ["calibration=jsonl", "objective=identity"],
        ["selection=uidl", "regularizer=none"],
        ["model=qwen25_7b_instruct", "calibration=fineweb"],
    ],
)
def test_configs_compose(overrides):
    cfg = compose_config(overrides)
    assert cfg.n_prune == 4 and cfg.num_lts == 1 and cfg.cuts is None
    if not any(o.startswith("calibration=") for o in overrides):
        assert cfg.calibration.name == "self_generated"  # the default job's data
    assert {"model", "calibration", "selection", "objective", "regularizer", "eval"} <= set(cfg)
    if "model=llama3_70b_instruct" in overrides:
        assert cfg.model.device_map == "auto" and cfg.model.dtype == "bfloat16"


@pytest.mark.unit
def test_experiments_compose_and_override_groups():
    cfg = compose_config(["experiment=uidl_baseline"])
    assert cfg.objective.name == "identity" and cfg.selection.tokens == "last" and cfg.regularizer.name == "none"


@pytest.mark.unit
@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["calibration=text_file", f"calibration.path={ROOT / 'README.md'}"],
        ["calibration=self_generated"],
        ["experiment=uidl_baseline"],
        ["eval=offline"],
        ["model=tiny_falcon", "cuts=[[2,4]]", "calibration.seq_len=16"],
    ],
)
def test_the_smoke_preset_composes_as_its_overrides_spelled_out(extra):
    preset = compose_config(["debug=smoke", *extra])
    suite = [] if any(e.startswith("eval=") for e in extra) else ["eval=heldout"]  # perplexity only
    spelled_out = compose_config(SMOKE_SPELLED_OUT + suite + extra)
    assert OmegaConf.to_container(preset) == OmegaConf.to_container(spelled_out)
    assert config_hash(preset) == config_hash(spelled_out)
    assert compose_config().model.name == "smollm2_135m"  # no debug preset unless asked for


@pytest.mark.unit
def test_config_hash_ignores_where_results_go():
    a = compose_config(SMOKE + ["results_dir=/a", "save_model=false"])
    b = compose_config(SMOKE + ["results_dir=/b"])
    c = compose_config(SMOKE + ["alpha=1"])
    assert config_hash(a) == config_hash(b) != config_hash(c)


@pytest.mark.integration
@pytest.mark.slow
def test_tiny_job_writes_a_complete_row_and_a_loadable_model(tmp_path):
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=full")
    row = run_recorded(cfg, sweep_id="t")
    assert row["status"] == "finished", row["error"]
    table = ResultsStore(tmp_path).load()
    assert len(table) == 1
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    assert not missing
    stored = table.iloc[0]
    assert json.loads(stored["cuts"]) == [[2, 4]] and stored["n_prune"] == 2 and stored["num_layers"] == 6
    assert stored["params_after"] < stored["params_before"] and 0 < stored["compression_ratio"] < 1
    assert stored["time_capture_s"] > 0 and stored["ppl_heldout"] > 1
    assert (
        stored["train_loss"] == pytest.approx(json.loads(stored["cut_train_losses"])["2-4"])
        and stored["train_loss"] > 0
    )
    assert pd.isna(stored["candidate_distances"])  # explicit cuts: no selection
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(stored["pruned_model_path"]).config.num_hidden_layers == 4


@pytest.mark.integration
@pytest.mark.slow
def test_finished_jobs_are_skipped_and_failed_jobs_leave_a_row(tmp_path, caplog):
    ok = job_config(tmp_path, "save_model=false")
    first = run_recorded(ok)
    assert first["status"] == "finished"
    with caplog.at_level("DEBUG"):
        again = run_recorded(ok)
    assert again["status"] == "skipped" and "skipping" in caplog.text and again["run_id"] == first["run_id"]
    forced = run_recorded(job_config(tmp_path, "save_model=false", "force=true"))
    assert forced["status"] == "finished" and forced["run_id"] != first["run_id"]

    bad = job_config(tmp_path, "n_prune=9")
    row = run_recorded(bad, raise_on_failure=False)
    assert row["status"] == "failed" and "n_prune=9" in row["error"] and "6 blocks" in row["error"]
    table = ResultsStore(tmp_path).load()
    assert sorted(table["status"]) == ["failed", "finished", "finished"]
    with pytest.raises(Exception, match="cuts="):
        run_recorded(job_config(tmp_path, "cuts=[[3,9]]"))
    assert len(ResultsStore(tmp_path).load()) == 4


@pytest.mark.integration
@pytest.mark.parametrize(
    "override, message",
    [
        ("calibration.n_samples=1", "at least 64 are needed"),
        ("regularizer=none", "alpha=0.5: has no effect with regularizer=none"),
        ("calibration=text_file", "calibration.path=None"),
    ],
)
def test_bad_input_fails_with_the_key_and_value(tmp_path, override, message):
    overrides = [override, "calibration.seq_len=16", "cuts=[[2,4]]"]
    if override == "regularizer=none":
        overrides.append("alpha=0.5")
    row = run_recorded(job_config(tmp_path, *overrides), raise_on_failure=False)
    assert row["status"] == "failed"
    assert message in row["error"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["text_file", "jsonl_chat"])
def test_jobs_calibrate_on_a_users_own_data(tmp_path, kind):
    if kind == "text_file":
        path = tmp_path / "own.txt"
        path.write_text("\n\n".join(f"My own paragraph {i} on depth pruning and linear maps. " * 6 for i in range(60)))
        overrides = ["calibration=text_file", f"calibration.path={path}"]
    else:
        path = tmp_path / "own.jsonl"
        turns = lambda i: [
            {"role": "user", "content": f"Question {i} about blocks?"},
            {"role": "assistant", "content": "An answer. " * 20},
        ]  # noqa: E731
        path.write_text("\n".join(json.dumps({"messages": turns(i)}) for i in range(40)))
        overrides = ["calibration=jsonl", f"calibration.path={path}"]
    row = run_recorded(job_config(tmp_path, *overrides, "calibration.n_samples=32", "save_model=false"))
    assert row["status"] == "finished" and row["calibration"] in ("text_file", "jsonl")
    assert row["n_calib_tokens"] > 64 and row["cos_dist_after"] >= 0
    assert row["chat_template"] is True  # SmolLM2's tokenizer renders the jsonl chats with its template


@pytest.mark.e2e
@pytest.mark.slow
def test_hydra_sweep_runs_four_jobs_then_skips_them(tmp_path):
    sweep = ["-m", *SMOKE, "objective=ls,identity", "alpha=0,10"]
    first, first_s = run_cli(sweep, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    table = ResultsStore(tmp_path).load()
    # identity takes no alpha: alpha=0 and alpha=10 are one configuration, run once.
    assert (first.stdout + first.stderr).count("job skipped: finished before as run") == 1
    assert len(table) == 3 and set(table["status"]) == {"finished"}
    assert sorted(zip(table["objective"], table["alpha"])) == [("identity", 0.0), ("ls", 0.0), ("ls", 10.0)]
    assert table["sweep_id"].nunique() == 1
    # One capture serves all jobs (same model, data and cut), one baseline perplexity too.
    assert (table["time_capture_s"] > 0).sum() == 1
    # Baseline perplexity and held-out distance without T: once each for all jobs.
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 2
    assert table["ppl_heldout_baseline"].nunique() == 1
    profile = json.loads(table["candidate_distances"].iloc[0])
    assert [c[:2] for c in profile] == [[s, s + 2] for s in range(1, 5)]
    assert json.loads(table["cuts"].iloc[0])[0] == min(profile, key=lambda c: c[2])[:2]
    ls = table[table["objective"] == "ls"].set_index("alpha")
    assert ls.loc[0.0, "regularizer"] == "none" and ls.loc[10.0, "regularizer"] == "l2"
    assert ls.loc[0.0, "cos_dist_after"] != ls.loc[10.0, "cos_dist_after"]
    assert table["cos_dist_before"].nunique() == 1
    identity = table[table["objective"] == "identity"]
    assert (identity["cos_dist_after"] == identity["cos_dist_before"]).all()

    second, second_s = run_cli(sweep, tmp_path)
    assert second.returncode == 0
    assert (second.stdout + second.stderr).count("job skipped: finished before as run") == 4
    assert len(ResultsStore(tmp_path).load()) == 3
    assert second_s < first_s


@pytest.mark.e2e
@pytest.mark.slow
def test_a_failed_job_does_not_stop_the_sweep_but_the_sweep_exits_non_zero_with_a_summary(tmp_path):
    proc, _ = run_cli(["-m", *SMOKE, "n_prune=2,99", "alpha=0.5,abc"], tmp_path)
    assert proc.returncode != 0  # after all jobs ran
    table = ResultsStore(tmp_path).load()
    assert len(table) == 4 and sorted(table["status"]) == ["failed", "failed", "failed", "finished"]
    finished = table[table["status"] == "finished"].iloc[0]
    assert finished["n_prune"] == 2 and finished["alpha"] == 0.5
    errors = " | ".join(table["error"].dropna())
    assert "n_prune=99" in errors and "alpha='abc': must be a finite number >= 0" in errors
    log = proc.stdout + proc.stderr
    assert "sweep: 1 finished, 0 skipped, 3 failed" in log
    line = next(line for line in log.splitlines() if "n_prune=99,alpha=abc" in line and "  failed " in line)
    assert "ConfigError: alpha='abc'" in line
    assert "Traceback" not in log  # configuration errors are one line each


@pytest.mark.e2e
@pytest.mark.slow
def test_explicit_cuts_from_the_command_line(tmp_path):
    proc, _ = run_cli([*SMOKE, "cuts=[[1,2],[4,6]]"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = ResultsStore(tmp_path).load().iloc[0]
    assert json.loads(row["cuts"]) == [[1, 2], [4, 6]] and row["n_prune"] == 3 and row["num_lts"] == 2
    assert pd.isna(row["selection_metric"])


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("selection", ["ls_residual", "l2", "uidl"])
def test_selection_metric_is_recorded_and_followed(tmp_path, selection):
    row = run_recorded(job_config(tmp_path, f"selection={selection}", "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["selection_metric"] == {"uidl": "angular_last"}.get(selection, selection)
    profile = row["candidate_distances"]
    assert len(profile) == 4 and row["cuts"] == [min(profile, key=lambda c: c[2])[:2]]
    if selection == "ls_residual":  # the residual is computed in the selection pass: no second pass
        assert row["selection_distance"] == pytest.approx(min(c[2] for c in profile))


@pytest.mark.integration
@pytest.mark.parametrize("structure", ["diagonal", "orthonormal"])
def test_structured_transforms_run_end_to_end(tmp_path, structure):
    row = run_recorded(job_config(tmp_path, f"structure={structure}", "cuts=[[2,4]]", "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["structure"] == structure and row["cos_dist_after"] != row["cos_dist_before"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "objective, extra",
    [
        ("cosine", ["objective.init=ls"]),
        ("cosine_exact", ["regularizer=l1", "alpha=1e-4"]),
        ("cosine", ["mask_ratio=0.25", "structure=diagonal"]),
    ],
)
def test_numerical_objectives_run_end_to_end(tmp_path, objective, extra):
    row = run_recorded(
        job_config(tmp_path, f"objective={objective}", "objective.epochs=2", "cuts=[[2,4]]", "save_model=false", *extra)
    )
    assert row["status"] == "finished", row["error"]
    assert row["solver"] == "adam" and row["store_location"] == "cpu" and row["train_loss"] > 0
    assert list(row["loss_curves"]) == ["2-4"] and len(row["loss_curves"]["2-4"]) == 3


@pytest.mark.unit
def test_ls_refuses_l1_and_a_mask_ratio_out_of_range(tmp_path):
    row = run_recorded(job_config(tmp_path, "regularizer=l1", "alpha=1"), raise_on_failure=False)
    assert row["status"] == "failed" and "regularizer='l1': objective=ls supports none, l2" in row["error"]
    row = run_recorded(job_config(tmp_path, "mask_ratio=1.5"), raise_on_failure=False)
    assert row["status"] == "failed" and "mask_ratio=1.5: must be a number in [0, 1)" in row["error"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("objective", ["ls", "cosine"])
def test_separate_placement_is_evaluated_in_memory_and_flagged(tmp_path, objective):
    row = run_recorded(
        job_config(
            tmp_path,
            "lt_placement=separate",
            "save_model=full",
            f"objective={objective}",
            "objective.epochs=1" if objective == "cosine" else "alpha=0",
        )
    )
    assert row["status"] == "finished", row["error"]
    assert row["lt_placement"] == "separate" and row["plain_checkpoint"] is False
    assert (Path(row["pruned_model_path"]) / "separate_transforms.safetensors").is_file()
    if objective == "ls":
        fused = run_recorded(job_config(tmp_path, "save_model=false"))
        assert fused["plain_checkpoint"] is True and fused["cuts"] == row["cuts"]
        assert fused["ppl_heldout"] != row["ppl_heldout"]


@pytest.mark.integration
@pytest.mark.slow
def test_sequential_multi_lt_estimates_each_transform_on_the_partly_pruned_model(tmp_path):
    import copy

    from replaceme_exp.capture import LinearStatistics, run_capture
    from replaceme_exp.data import build_calibration
    from replaceme_exp.estimation import ridge_solve
    from replaceme_exp.models import adapter_for, load_model
    from replaceme_exp.surgery import load_pruned, prune

    cuts = "cuts=[[1,2],[3,5]]"
    sequential = run_recorded(job_config(tmp_path, cuts, "multi_lt=sequential", "save_model=full"))
    independent = run_recorded(job_config(tmp_path, cuts, "multi_lt=independent", "save_model=full"))
    assert sequential["status"] == independent["status"] == "finished"
    assert sequential["multi_lt"] == "sequential" and sequential["kept_blocks"] == [0, 2, 5]
    assert sorted(sequential["cut_train_losses"]) == ["1-2", "3-5"]

    cfg = job_config(tmp_path, cuts)
    loaded = load_model(cfg.model, str(CACHE))
    calibration = build_calibration(cfg.calibration, loaded.tokenizer)
    expected = copy.deepcopy(loaded.model)
    adapter = adapter_for(expected)
    for cut in [(1, 2), (2, 4)]:  # the second cut, [3, 5), sits at [2, 4) once block 1 is gone
        stats = LinearStatistics([cut], adapter.hidden_size, torch.device("cpu"))
        run_capture(adapter, calibration, [stats])
        prune(adapter, [cut], {cut: ridge_solve(stats.result()[cut])})
    ids = torch.randint(0, 1000, (1, 12))
    saved_sequential = load_pruned(sequential["pruned_model_path"]).eval()
    torch.testing.assert_close(saved_sequential(ids).logits, expected(ids).logits, rtol=1e-4, atol=1e-4)
    saved_independent = load_pruned(independent["pruned_model_path"]).eval()
    assert not torch.allclose(saved_independent(ids).logits, expected(ids).logits, atol=1e-4)


@pytest.mark.e2e
@pytest.mark.slow
def test_parallel_local_workers_lose_no_row_and_prefix_their_console_lines(tmp_path):
    sweep = ["seed=1,2,3,4", "objective=ls,identity"]
    proc, _ = run_cli(
        [
            "-m",
            "hydra/launcher=local_parallel",
            "hydra.launcher.n_jobs=2",
            *SMOKE,
            *sweep,
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = ResultsStore(tmp_path).load()
    assert len(table) == 8 and set(table["status"]) == {"finished"} and table["config_hash"].nunique() == 8
    assert not list((tmp_path / "runs").rglob("*.tmp"))
    # each job's console lines carry its number; its own run.log does not
    console = (proc.stdout + proc.stderr).splitlines()
    for job in range(8):
        assert any(line.startswith(f"[job {job}] ") and "stage load" in line for line in console), job
    logs = list((tmp_path / "hydra" / "multirun").glob("*/*/run.log"))
    assert len(logs) == 8 and all("[job " not in log.read_text() and "stage load" in log.read_text() for log in logs)

    again, _ = run_cli(["-m", "hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2", *SMOKE, *sweep], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    console = (again.stdout + again.stderr).splitlines()
    for job in range(8):  # a skipped job prints one line
        (line,) = [line for line in console if line.startswith(f"[job {job}] ")]
        assert "job skipped: finished before as run" in line


@pytest.mark.unit
@pytest.mark.parametrize(
    "launcher, keys",
    [("slurm_1gpu", {"gpus_per_node": 1}), ("slurm_multi_gpu", {"gpus_per_node": 4}), ("slurm_cpu", {"gpus_per_node": 0})],
)
def test_slurm_presets_compose(launcher, keys):
    from helpers.config import CONF
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[f"hydra/launcher={launcher}", "hydra.launcher.partition=a100"],
            return_hydra_config=True,
        )
    launcher_cfg = cfg.hydra.launcher
    assert launcher_cfg._target_.endswith("SlurmLauncher") and launcher_cfg.partition == "a100"
    assert launcher_cfg.timeout_min > 0 and launcher_cfg.mem_gb > 0
    assert all(launcher_cfg[k] == v for k, v in keys.items())


@pytest.mark.integration
@pytest.mark.slow
def test_numerical_objectives_apply_their_regulariser(tmp_path):
    common = ["objective=cosine", "objective.epochs=2", "objective.lr=1e-2", "cuts=[[2,4]]", "save_model=false"]
    plain = run_recorded(job_config(tmp_path, *common))
    l1 = run_recorded(job_config(tmp_path, *common, "regularizer=l1", "alpha=1e-3"))
    assert plain["regularizer"] == "none" and l1["regularizer"] == "l1"
    assert l1["train_loss"] > plain["train_loss"]  # the reported loss includes the L1 penalty


@pytest.mark.integration
@pytest.mark.slow
def test_an_ls_start_for_a_numerical_objective_costs_no_extra_pass(tmp_path, monkeypatch):
    import replaceme_exp.estimation.fitting as fitting
    import replaceme_exp.selection.passes as planning

    passes = []
    for module in (fitting, planning):
        original = module.run_capture

        def counted(adapter, batches, statistics, desc="capture", execution=None, _original=original):
            passes.append(desc)
            return _original(adapter, batches, statistics, desc=desc, execution=execution)

        monkeypatch.setattr(module, "run_capture", counted)
    row = run_recorded(
        job_config(tmp_path, "objective=cosine", "objective.init=ls", "objective.epochs=1", "cuts=[[2,4]]")
    )
    assert row["status"] == "finished", row["error"]
    assert [p for p in passes if "held-out" not in p] == ["capture (tokens)"]


@pytest.mark.integration
@pytest.mark.slow
def test_layer_distances_ride_on_the_selection_pass_and_are_cached(tmp_path, monkeypatch):
    """The matrix joins the selection pass (no pass of its own), a second job reads it from the
    cache, and a job with explicit cuts (no selection pass) runs one pass for it; all three equal
    a standalone LayerDistances capture over the same calibration batches."""
    import replaceme_exp.pipeline.job as job
    import replaceme_exp.selection.passes as planning
    from replaceme_exp.capture import LayerDistances, run_capture
    from replaceme_exp.data import build_calibration
    from replaceme_exp.models import adapter_for, load_model

    passes = []
    for module in (job, planning):
        original = module.run_capture

        def counted(adapter, batches, statistics, desc="capture", execution=None, _original=original):
            passes.append(desc)
            return _original(adapter, batches, statistics, desc=desc, execution=execution)

        monkeypatch.setattr(module, "run_capture", counted)

    first = run_recorded(job_config(tmp_path, "record_layer_distances=true", "save_model=false"))
    assert first["status"] == "finished", first["error"]
    assert [p for p in passes if "held-out" not in p] == ["capture (selection)"]
    passes.clear()
    again = run_recorded(job_config(tmp_path, "record_layer_distances=true", "save_model=false", "alpha=3"))
    assert [p for p in passes if "held-out" not in p] == [] and again["layer_distances"] == first["layer_distances"]
    passes.clear()
    fresh = tmp_path / "fresh"
    explicit = run_recorded(job_config(fresh, "record_layer_distances=true", "save_model=false", "cuts=[[2,4]]"))
    assert [p for p in passes if "held-out" not in p] == ["capture (statistics)", "layer distances"]

    cfg = typed_config(job_config(tmp_path))
    loaded = load_model(cfg.model, cfg.cache_dir)
    reference = LayerDistances(len(first["layer_distances"]))
    run_capture(adapter_for(loaded.model), build_calibration(cfg.calibration, loaded.tokenizer), [reference])
    for matrix in (first["layer_distances"], explicit["layer_distances"]):
        assert torch.allclose(torch.tensor(matrix), torch.tensor(reference.result()), atol=1e-6)


@pytest.mark.unit
def test_the_git_sha_is_read_once_at_import_so_a_long_sweep_records_the_code_it_runs():
    from replaceme_exp.results import row as job

    assert job.git_sha.cache_info().currsize == 1  # read when the module was imported
    before = job.git_sha.cache_info().hits
    assert job.git_sha() == job.git_sha()
    assert job.git_sha.cache_info().hits == before + 2 and job.git_sha.cache_info().misses == 1


@pytest.mark.integration
def test_save_transforms_writes_each_cuts_t_which_the_checkpoint_holds_fused(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from replaceme_exp.models import adapter_for, load_model

    row = run_recorded(job_config(tmp_path, "cuts=[[2,4]]", "save_transforms=true", "save_model=full"))
    assert row["status"] == "finished"
    saved = load_file(row["transforms_path"])
    assert set(saved) == {"2-4"} and saved["2-4"].dtype == torch.float64 and saved["2-4"].shape == (64, 64)
    # the checkpoint's fusion target (block 1, before the cut) holds T^T W of the unpruned model's W
    unpruned = load_model(job_config(tmp_path, "cuts=[[2,4]]").model, str(CACHE)).model
    weight = adapter_for(unpruned).fusion_target(1).weight.double()
    pruned = AutoModelForCausalLM.from_pretrained(row["pruned_model_path"])
    fused = adapter_for(pruned).fusion_target(1).weight.double()
    torch.testing.assert_close(fused, saved["2-4"].T @ weight, rtol=1e-5, atol=1e-6)
    # where a job writes is not what it computes
    assert config_hash(compose_config(SMOKE + ["save_transforms=true"])) == config_hash(compose_config(SMOKE))
