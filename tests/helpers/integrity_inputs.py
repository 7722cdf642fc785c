"""What the unit, integration and e2e tests of integrity inputs share: fixtures, builders and constants."""

from __future__ import annotations

import pytest
from helpers.config import compose_config
from helpers.hub_cache import empty_offline_cache
from helpers.jobs import SMOKE

from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline import JobSpec


@pytest.fixture(autouse=True)
def hf_cache(monkeypatch, tmp_path):
    """An empty, offline Hugging Face cache; returns the datasets cache."""
    return empty_offline_cache(monkeypatch, tmp_path / "hf")


def spec(tmp_path, *overrides) -> JobSpec:
    """The tiny job's spec (the checks of the configuration passed: only the inputs are left); on
    the tiny CLIP model (which ``debug=smoke``'s text calibration does not fit) without the preset."""
    preset = [] if "model=tiny_clip" in overrides else SMOKE
    return JobSpec.from_config(compose_config([*preset, f"results_dir={tmp_path}/results", *overrides]))


def refusal(tmp_path, *overrides) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        spec(tmp_path, *overrides).check_inputs()
    return err.value


def written(tmp_path, name: str, content: bytes | str):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path
