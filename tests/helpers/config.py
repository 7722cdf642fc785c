"""The project's paths and its Hydra config composed as run.py composes it."""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose, initialize_config_dir

import replaceme_exp.pipeline  # noqa: F401  (the config schema in Hydra's ConfigStore, as run.py has it)
from replaceme_exp.config.validate import typed_config
from replaceme_exp.pipeline.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
CACHE = Path(os.environ.get("REPLACEME_CACHE", ROOT / ".cache"))


def compose_config(overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides or [])


def typed(overrides: list[str] | None = None):
    """The composed config as the typed :class:`~replaceme_exp.config.schema.JobConfig` stages take."""
    return typed_config(compose_config(overrides))


def config_hash(cfg, weights: dict | None = None) -> str:
    """The config hash of a composed config (as a job computes it)."""
    return JobSpec.from_config(cfg, weights).config_hash


def setting_hash(cfg, weights: dict | None = None) -> str:
    return JobSpec.from_config(cfg, weights).setting_hash


def validate_config(cfg) -> None:
    """Everything a job checks before loading a model (one ConfigError naming key, value, reason)."""
    JobSpec.from_config(cfg)
