"""Healing: lt_only trains T itself and fuses it back, full_model trains every weight, lora (peft)
merges into a plain model; the job records the healing stage and the perplexity before and after."""

from __future__ import annotations

import pytest
from helpers.config import compose_config, config_hash
from helpers.healing import HEAL
from helpers.jobs import SMOKE

from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["objective=identity", "healing=lt_only"], "healing"),
        (["healing=lora", "healing.lr=-1"], "healing.lr"),
        (["healing=full_model", "healing/data=text_file"], "healing.data.path"),
        (["healing=lt_only", "healing.max_steps=0"], "healing.max_steps"),
        (["healing=lora", "healing.lora.target_modules=attention"], "healing.lora.target_modules"),
    ],
)
def test_bad_healing_settings_fail_before_any_model_loads(tmp_path, overrides, key):
    cfg = compose_config(SMOKE + [f"results_dir={tmp_path}", *HEAL, *overrides])
    with pytest.raises(ConfigError) as err:
        run_recorded(cfg, sweep_id="h")
    assert err.value.key == key


@pytest.mark.slow
def test_the_config_hash_follows_what_healing_learns_not_how_it_logs():
    base = compose_config(SMOKE + HEAL + ["healing=lt_only"])
    assert config_hash(base) == config_hash(compose_config(SMOKE + HEAL + ["healing=lt_only", "healing.log_every=1"]))
    assert config_hash(base) != config_hash(compose_config(SMOKE + HEAL + ["healing=lt_only", "healing.lr=1e-3"]))
    assert config_hash(base) != config_hash(compose_config(SMOKE + HEAL + ["healing=full_model"]))
    none = compose_config(SMOKE + ["cuts=[[2,4]]"])
    # A sweep sets healing keys for all its jobs, healing=none among them: inert there.
    inert = ["healing/data=pydoc", "healing.max_steps=3", "healing.lora.r=4"]
    assert config_hash(none) == config_hash(compose_config(SMOKE + ["cuts=[[2,4]]", *inert]))
    assert compose_config(["healing=lt_only"]).healing.data.dataset == "allenai/c4"  # the paper's data by default
    assert compose_config(["healing=full_model"]).healing.gradient_accumulation_steps == 4


@pytest.mark.slow
def test_master_weights_enter_the_hash_only_where_low_precision_weights_train():
    def differs(*extra):
        job = SMOKE + HEAL + list(extra)
        return config_hash(compose_config(job)) != config_hash(compose_config(job + ["healing.master_weights=model"]))

    assert differs("healing=full_model", "model.dtype=bfloat16")
    assert differs("healing=lt_only", "lt_placement=separate", "model.dtype=float16")
    assert not differs("healing=full_model")  # float32 weights: nothing to keep a master copy of
    assert not differs("healing=lt_only", "model.dtype=bfloat16")  # the fused T always trained in float32
    assert not differs("healing=lora", "model.dtype=bfloat16")  # peft's adapters are float32
    assert not differs("model.dtype=bfloat16")
    spec = JobSpec.from_config(compose_config(SMOKE + HEAL + ["healing=full_model", "model.dtype=bfloat16"]))
    assert spec.setting_columns()["healing_master_weights"] == "float32"


def test_the_summary_line_shows_perplexity_before_and_after_healing():
    from replaceme_exp.runtime.job_summary import summary_line

    row = {"status": "finished", "run_id": "r", "cuts": [[2, 4]], "ppl_heldout_baseline": 10.0}
    row.update(ppl_heldout_before_healing=30.0, ppl_heldout=15.0, healing="lt_only", time_total_s=5)
    assert "held-out ppl 10.00 -> 30.00 pruned, healed (lt_only) -> 15.00 (x1.50)" in summary_line(row)
