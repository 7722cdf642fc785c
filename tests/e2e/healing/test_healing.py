"""Healing: lt_only trains T itself and fuses it back, full_model trains every weight, lora (peft)
merges into a plain model; the job records the healing stage and the perplexity before and after."""

from __future__ import annotations

import json

import pytest
from helpers.config import compose_config
from helpers.healing import HEAL
from helpers.jobs import SMOKE

from replaceme_exp.config.validate import typed_config
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded


@pytest.mark.slow
def test_a_healing_job_records_its_stage_and_saves_the_healed_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from replaceme_exp.data import heldout_windows
    from replaceme_exp.evaluation import perplexity
    from replaceme_exp.models.loading import load_model

    plain = run_recorded(compose_config(SMOKE + [f"results_dir={tmp_path}", "cuts=[[2,4]]"]), sweep_id="h")
    energy = ["tracking.codecarbon.enabled=true"]  # the healing stage's energy and CO2 in the row
    cfg = compose_config(SMOKE + [f"results_dir={tmp_path}", *HEAL, "healing=lt_only", "healing.lr=1e-3", *energy])
    row = run_recorded(cfg, sweep_id="h")
    assert row["status"] == "finished", row["error"]
    # Before healing = the same pruning without healing; after = the saved healed checkpoint.
    assert row["ppl_heldout_before_healing"] == pytest.approx(plain["ppl_heldout"], rel=1e-6)
    assert row["ppl_heldout"] != row["ppl_heldout_before_healing"]
    assert row["healing_steps"] == 6 and row["healing_trainable_params"] == 64 * 64
    assert row["time_heal_s"] > 0 and row["stage_seconds"]["healing (lt_only)"] > 0
    assert row["energy_kwh_heal"] > 0 and row["co2_kg_heal"] > 0
    assert len(row["healing_loss_curve"]) == 3 and row["healing_transform_change"]["2-4"] > 0
    table = ResultsStore(tmp_path).load()
    stored = table[table["run_id"] == row["run_id"]].iloc[0]
    assert stored["healing"] == "lt_only" and json.loads(stored["healing_loss_curve"])[-1][0] == 6
    assert json.loads(stored["healing_settings"])["lr"] == 1e-3 and stored["healing_data"] == "pydoc"
    healed = AutoModelForCausalLM.from_pretrained(row["pruned_model_path"])
    settings = typed_config(cfg)
    tokenizer = load_model(settings.model, str(tmp_path / "cache")).tokenizer
    assert perplexity(healed, heldout_windows(settings.eval, tokenizer)) == pytest.approx(row["ppl_heldout"], rel=1e-5)
