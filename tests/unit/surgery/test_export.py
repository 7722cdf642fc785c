"""save_model=transform (the default): a job keeps its cuts and transforms (a few kB on the tiny
model), and the exported checkpoint equals the one save_model=full saves, bit for bit; job=evaluate
reads it; the config hash does not depend on save_model."""

from __future__ import annotations

import pytest
from helpers.config import compose_config
from helpers.jobs import SMOKE

from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.pipeline.rules import model_save


def test_save_model_does_not_move_the_config_hash_and_healing_saves_the_full_model():
    values = ("transform", "full", "false")
    specs = {v: JobSpec.from_config(compose_config([*SMOKE, f"save_model={v}"])) for v in values}
    specs["true"] = JobSpec.from_config(compose_config([*SMOKE, "save_model=true"]))
    default = JobSpec.from_config(compose_config(SMOKE))
    assert {s.config_hash for s in specs.values()} == {default.config_hash}
    assert default.model_save == "transform" and not default.saves_model
    assert specs["full"].model_save == specs["true"].model_save == "full" and specs["false"].model_save is None
    healed = compose_config([*SMOKE, "healing=lt_only"])
    assert model_save(JobSpec.from_config(healed).config) == "full"
    with pytest.raises(ConfigError, match="save_model='everything'"):
        JobSpec.from_config(compose_config([*SMOKE, "save_model=everything"]))
