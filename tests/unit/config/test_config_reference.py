"""The configuration reference (docs/configuration.md) is generated from the schema and is current."""

from __future__ import annotations

from helpers.config import ROOT

from replaceme_exp.reporting.config_reference import render


def test_the_configuration_reference_is_current():
    assert (ROOT / "docs" / "configuration.md").read_text() == render(), "run make docs-reference"


def test_the_reference_names_every_key_of_every_shipped_option():
    text = render()
    for key in ("`n_prune`", "`calibration.prompts_path`", "`objective.batch_tokens`", "`eval.harness.metrics`",
                "`healing.lora.target_modules`", "`capture.layerwise.location`", "`tracking.wandb.mode`"):  # fmt: skip
        assert key in text, key
