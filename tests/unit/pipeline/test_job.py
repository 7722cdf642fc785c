"""Jobs and sweeps: config composition, rows, skipping finished jobs, failed rows, caches."""

from __future__ import annotations

import pytest
from helpers.config import ROOT, compose_config, config_hash
from helpers.jobs import SMOKE, job_config
from omegaconf import OmegaConf

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


def test_experiments_compose_and_override_groups():
    cfg = compose_config(["experiment=uidl_baseline"])
    assert cfg.objective.name == "identity" and cfg.selection.tokens == "last" and cfg.regularizer.name == "none"


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


def test_config_hash_ignores_where_results_go():
    a = compose_config(SMOKE + ["results_dir=/a", "save_model=false"])
    b = compose_config(SMOKE + ["results_dir=/b"])
    c = compose_config(SMOKE + ["alpha=1"])
    assert config_hash(a) == config_hash(b) != config_hash(c)


def test_ls_refuses_l1_and_a_mask_ratio_out_of_range(tmp_path):
    row = run_recorded(job_config(tmp_path, "regularizer=l1", "alpha=1"), raise_on_failure=False)
    assert row["status"] == "failed" and "regularizer='l1': objective=ls supports none, l2" in row["error"]
    row = run_recorded(job_config(tmp_path, "mask_ratio=1.5"), raise_on_failure=False)
    assert row["status"] == "failed" and "mask_ratio=1.5: must be a number in [0, 1)" in row["error"]


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


def test_the_git_sha_is_read_once_at_import_so_a_long_sweep_records_the_code_it_runs():
    from replaceme_exp.results import row as job

    assert job.git_sha.cache_info().currsize == 1  # read when the module was imported
    before = job.git_sha.cache_info().hits
    assert job.git_sha() == job.git_sha()
    assert job.git_sha.cache_info().hits == before + 2 and job.git_sha.cache_info().misses == 1
