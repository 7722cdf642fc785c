"""End to end on the real SmolLM2-135M-Instruct (embedded, offline)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose_config
from transformers import AutoModelForCausalLM

from replaceme_exp.job import run_recorded
from replaceme_exp.results import ResultsStore

pytestmark = pytest.mark.slow

SMALL = ["calibration.n_samples=48", "eval.max_windows=8"]


def test_least_squares_beats_plain_removal_on_the_same_cut(tmp_path):
    common = [*SMALL, f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats"]
    ls = run_recorded(compose_config([*common, "objective=ls", "eval=offline", "eval.max_windows=8"]))
    assert ls["status"] == "finished"
    cuts = ls["cuts"]
    assert len(cuts) == 1 and cuts[0][1] - cuts[0][0] == 8 and ls["num_layers"] == 30
    identity = run_recorded(
        compose_config([*common, "objective=identity", f"cuts={json.dumps(cuts).replace(' ', '')}", "save_model=false"])
    )
    assert identity["status"] == "finished" and identity["cuts"] == cuts
    assert ls["ppl_heldout"] < identity["ppl_heldout"]
    assert ls["ppl_heldout_baseline"] == identity["ppl_heldout_baseline"] < ls["ppl_heldout"]
    assert identity["cos_dist_after"] == pytest.approx(identity["cos_dist_before"])
    assert len(ResultsStore(tmp_path).load()) == 2
    # The real model answers most offline questions; pruning a quarter of it costs accuracy.
    assert ls["avg_acc_baseline"] > 0.7 and 0 < ls["rp"] < 1.05 and ls["ppl_pydoc"] > 1
    assert ls["energy_kwh"] > 0 and ls["wandb_dir"]

    reloaded = AutoModelForCausalLM.from_pretrained(ls["pruned_model_path"]).eval()
    assert reloaded.config.num_hidden_layers == 22
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(
        reloaded.generate(ids, use_cache=True, **kwargs), reloaded.generate(ids, use_cache=False, **kwargs)
    )
