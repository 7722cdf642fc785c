"""End to end on the real SmolLM2-135M-Instruct (embedded, offline)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.config import compose_config
from transformers import AutoModelForCausalLM

from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded


pytestmark = pytest.mark.slow

SMALL = ["calibration=pydoc", "n_prune=8", "calibration.n_samples=48", "eval.max_windows=8", "eval.speed.enabled=false"]
OFFLINE_24 = ["eval=offline", "eval.harness.limit=24"]  # the first 24 items of each task (eval=quick: 40)


def test_least_squares_beats_plain_removal_on_the_same_cut(tmp_path):
    common = [*SMALL, f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", "eval.samples=null"]
    ls = run_recorded(
        compose_config([*common, "objective=ls", "calibration.n_samples=24", *OFFLINE_24, "save_model=full"])
    )
    assert ls["status"] == "finished"
    cuts = ls["cuts"]
    assert len(cuts) == 1 and cuts[0][1] - cuts[0][0] == 8 and ls["num_layers"] == 30
    cut_override = json.dumps(cuts).replace(" ", "")
    identity = run_recorded(
        compose_config([*common, "objective=identity", f"cuts={cut_override}", "eval=heldout", "save_model=false"])
    )
    assert identity["status"] == "finished" and identity["cuts"] == cuts
    assert ls["ppl_heldout"] < identity["ppl_heldout"]
    assert ls["ppl_heldout_baseline"] == identity["ppl_heldout_baseline"] < ls["ppl_heldout"]
    assert identity["cos_dist_after"] == pytest.approx(identity["cos_dist_before"])
    assert len(ResultsStore(tmp_path).load()) == 2
    # The real model is well above chance on each offline task (0.25 for 4 choices, 0.5 for a pair, near 0
    # for a greedy word); pruning a quarter of it costs accuracy.
    assert ls["baseline_acc_replaceme_world_mc"] > 0.5 and ls["baseline_acc_replaceme_doc_pairs"] > 0.8
    assert ls["baseline_acc_replaceme_doc_cloze"] > 0.2 and 0 < ls["rp"] < 1.05 and ls["ppl_pydoc"] > 1
    assert ls["energy_kwh"] > 0 and ls["wandb_dir"]

    reloaded = AutoModelForCausalLM.from_pretrained(ls["pruned_model_path"]).eval()
    assert reloaded.config.num_hidden_layers == 22
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(
        reloaded.generate(ids, use_cache=True, **kwargs), reloaded.generate(ids, use_cache=False, **kwargs)
    )


def test_the_first_token_is_the_attention_sink_that_dominates_the_least_squares_target():
    """The premise of ``estimation.tokens``, on the real model: at cut [11, 19) position 0 is the
    only token above 20x the median norm of L_18, it holds most of ||L_18 - Y_10||^2, and
    ``skip_massive`` leaves out exactly the first token of each sequence."""
    from helpers.config import CACHE, typed

    from replaceme_exp.capture import LinearStatistics, TokenRule, run_capture
    from replaceme_exp.capture.token_rules import massive_tokens
    from replaceme_exp.data import build_calibration
    from replaceme_exp.models import adapter_for, load_model

    cfg = typed(["calibration=pydoc", "calibration.n_samples=8", "calibration.seq_len=64"])
    loaded = load_model(cfg.model, str(CACHE))
    adapter = adapter_for(loaded.model)
    calibration = build_calibration(cfg.calibration, loaded.tokenizer)
    seen = []

    class Sinks:
        takes_padding = False

        def requests(self):
            def update(acts, tokens):
                target = (acts[("L", 18)] - acts[("L", 10)] + acts[("M", 10)]).float()
                flagged = massive_tokens((acts[("L", 10)], acts[("L", 18)]), tokens.last_rows, 20.0)
                seen.append((tokens.positions, flagged, target.pow(2).sum(-1)))

            return [((("M", 10), ("L", 10), ("L", 18)), update)]

    skip = LinearStatistics([(11, 19)], adapter.hidden_size, torch.device("cpu"), rule=TokenRule("skip_massive"))
    run_capture(adapter, calibration, [Sinks(), skip])
    positions = torch.cat([s[0] for s in seen])
    flagged = torch.cat([s[1] for s in seen])
    energy = torch.cat([s[2] for s in seen])
    assert torch.equal(flagged, positions == 0) and int(flagged.sum()) == 8
    assert float(energy[flagged].sum() / energy.sum()) > 0.9
    assert skip.result()[(11, 19)].n_tokens == calibration.n_tokens - 8
