"""What the unit and integration tests of model shape share: fixtures, builders and constants."""

from __future__ import annotations

from helpers.config import compose_config

from replaceme_exp.pipeline.spec import JobSpec


def model_cfg(*overrides):
    return JobSpec.from_config(compose_config(list(overrides))).config.model
