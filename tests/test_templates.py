"""Every multirun template composes and expands to the number of jobs of its table or figure."""

from __future__ import annotations

import pytest
from conftest import CONF, ROOT, compose_config
from hydra.core.override_parser.overrides_parser import OverridesParser

GROUPS = ("paper", "study")  # the paper's tables and figures; studies beyond the paper
TEMPLATES = sorted(
    f"{p.parent.name}/{p.stem}" for group in GROUPS for p in (ROOT / "multirun_templates" / group).glob("*.yaml")
)
EXPECTED_JOBS = {
    "paper/block_selection": 72,
    "paper/calibration_size": 10,
    "paper/calibration_types": 10,
    "paper/clip": 4,
    "paper/cosine_approximation": 2,
    "paper/fused_vs_separate": 2,
    "paper/healing": 3,
    "paper/higher_compression": 8,
    "paper/layer_distances": 1,
    "paper/llama2_comparison": 3,
    "paper/leaderboard": 6,
    "paper/llama3_main": 12,
    "paper/masking": 4,
    "paper/model_scales": 2,
    "paper/multi_lt_count": 8,
    "paper/pruned_layers": 40,
    "paper/regularization": 7,
    "paper/regularization_cosine": 4,
    "paper/solvers": 4,
    "paper/structured_lts": 3,
    "paper/task_specific": 4,
    "paper/time_emissions": 3,
    "study/sink_tokens": 384,
}


def expand(template: str) -> tuple[object, list[dict]]:
    """The composed template and the jobs its sweeper parameters expand to (their product)."""
    cfg = compose_config_with_hydra(template)
    params = cfg.hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [(o.key_or_group, list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]) for o in parsed]
    jobs = [{}]
    for key, values in axes:
        jobs = [{**job, key: v} for job in jobs for v in values]
    return cfg, jobs


def template_override(template: str) -> str:
    """``paper/regularization`` -> ``+paper=regularization``."""
    group, name = template.split("/")
    return f"+{group}={name}"


# What a user must add to a template: the CLIP template calibrates on their own images (the paper's MIMIC).
USER_OVERRIDES = {"paper/clip": [f"calibration.path={ROOT}"]}


def compose_config_with_hydra(template: str):
    from hydra import compose, initialize_config_dir

    overrides = [template_override(template), *USER_OVERRIDES.get(template, [])]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_jobs_pass_validation(template):
    from omegaconf import open_dict

    from replaceme_exp.validation import validate_config

    cfg = compose_config_with_hydra(template)
    with open_dict(cfg):
        del cfg["hydra"]
    validate_config(cfg)


def test_the_clip_template_without_images_is_refused_in_one_line():
    from hydra import compose, initialize_config_dir

    from replaceme_exp.errors import ConfigError
    from replaceme_exp.validation import validate_config

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["+paper=clip"])
    with pytest.raises(ConfigError, match=r"^calibration.path='\?\?\?': no such image folder"):
        validate_config(cfg)


def test_every_template_is_counted():
    assert TEMPLATES == sorted(EXPECTED_JOBS)


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_composes_and_expands(template):
    cfg, jobs = expand(template)
    assert len(jobs) == EXPECTED_JOBS[template]
    text = (ROOT / "multirun_templates" / f"{template}.yaml").read_text()
    assert text.startswith("# @package _global_\n# ") and f"python run.py -m {template_override(template)}" in text
    assert "GPU hours" in text or "CPU time" in text
    # Each job's overrides compose too (e.g. cuts and model names are valid).
    for job in jobs[:: max(1, len(jobs) // 6)]:
        overrides = [template_override(template)] + [f"{k}={_value(v)}" for k, v in job.items()]
        composed = compose_config(overrides)
        assert composed.model.name and composed.eval.name


def _value(v) -> str:
    return str(v).replace(" ", "") if isinstance(v, list) else str(v)


@pytest.mark.parametrize(
    ("template", "job", "expected"),
    [
        ("llama3_main", "experiment=multi_lt_nc_cosine", {"objective.name": "cosine", "num_lts": 2}),
        ("llama3_main", "experiment=uidl_baseline", {"objective.name": "identity", "selection.tokens": "last"}),
        ("healing", "healing=lt_only", {"healing.name": "lt_only", "healing.max_steps": 80000}),
        ("layer_distances", "seed=42", {"record_layer_distances": True, "calibration.n_samples": 256}),
        ("task_specific", "calibration=sciq", {"calibration.dataset": "allenai/sciq", "eval.name": "sciq"}),
        ("model_scales", "n_prune=0.25", {"n_prune": 0.25, "objective.name": "ls", "calibration.name": "slimorca"}),
    ],
)
def test_template_jobs_get_their_method(template, job, expected):
    from omegaconf import OmegaConf

    cfg = compose_config([f"+paper={template}", job])
    for key, value in expected.items():
        assert OmegaConf.select(cfg, key) == value, key


def test_templates_resolve_from_the_package_from_any_directory_and_cannot_be_hijacked(tmp_path):
    import os
    import subprocess
    import sys

    fake = tmp_path / "multirun_templates" / "paper"
    fake.mkdir(parents=True)
    (fake / "regularization.yaml").write_text("# @package _global_\nn_prune: 1\nhijacked: true\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

    def composed(template: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(ROOT / "run.py"), "--cfg", "job", f"+paper={template}"]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    proc = composed("regularization")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hijacked" not in proc.stdout and "name: llama3_8b_instruct" in proc.stdout
    unknown = composed("no_such_table")
    assert unknown.returncode != 0 and "no_such_table" in unknown.stderr
