"""SLEB (``selection=sleb``): the greedy removal order and each step's calibration perplexity
against a brute-force loop (a deep copy of the model per candidate, the block taken out, the
calibration loss from the model's own ``labels`` loss), the barriers, the model left as it was,
the preset's job and row, and its step store (a killed or deeper search takes the finished steps,
equal to a search from scratch, and counts their measured cost)."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers.config import compose_config
from helpers.jobs import SMOKE, job_config

from replaceme_exp.reporting.compression_cost import compression_cost
from replaceme_exp.runtime import run_recorded


@pytest.mark.slow
def test_the_sleb_preset_removes_its_blocks_and_records_them(tmp_path):
    row = run_recorded(job_config(tmp_path, "experiment=sleb", "n_prune=2", "eval.samples=null"))
    assert row["status"] == "finished", row.get("error")
    assert row["method"] == "SLEB" and row["selection_metric"] == "sleb"
    assert row["selection_early_barrier"] == 1 and row["selection_latter_barrier"] == 1
    assert row["selection_window"] is None
    order = row["sleb_removal_order"]
    assert len(order) == 2 and not {0, 5} & set(order) and len(row["sleb_step_ppl"]) == 2
    assert row["kept_blocks"] == [i for i in range(6) if i not in order]
    assert row["time_capture_s"] > 0


@pytest.mark.slow
def test_sleb_jobs_share_their_steps_through_the_store_and_count_their_cost(tmp_path):
    def sleb_job(results: str, n: int, *overrides: str) -> dict:
        """A SLEB job with its own results folder (a job of the same settings is not skipped) and
        the one step store under tmp_path/stats."""
        folders = [f"results_dir={tmp_path / results}", f"capture.cache_dir={tmp_path}/stats"]
        return run_recorded(
            compose_config([*SMOKE, *folders, "experiment=sleb", f"n_prune={n}", "eval.samples=null", *overrides])
        )

    shallow = sleb_job("a", 2)
    deeper = sleb_job("a", 3)  # steps 1 and 2 from the store
    again = sleb_job("b", 2)  # every step from the store: no search stage runs
    alone = sleb_job("c", 3, "capture.search_steps=false")  # the store holds all 3 steps, unread
    assert {r["status"] for r in (shallow, deeper, again, alone)} == {"finished"}
    assert deeper["sleb_removal_order"] == alone["sleb_removal_order"]
    assert deeper["sleb_removal_order"][:2] == shallow["sleb_removal_order"] == again["sleb_removal_order"]
    assert deeper["ppl_heldout"] == alone["ppl_heldout"] and again["ppl_heldout"] == shallow["ppl_heldout"]
    assert (deeper["search_steps_reused"], again["search_steps_reused"], alone["search_steps_reused"]) == (2, 2, 0)
    stages = [f"selection search (sleb) step {k}" for k in (1, 2, 3)]
    measured = shallow["stage_seconds"][stages[0]] + shallow["stage_seconds"][stages[1]]
    assert deeper["time_reused_s"] == pytest.approx(measured, rel=1e-9)
    assert again["time_reused_s"] == pytest.approx(measured, rel=1e-9)
    assert [s in deeper["stage_seconds"] for s in stages] == [False, False, True]
    assert not any(s in again["stage_seconds"] for s in stages) and again["time_capture_s"] == 0
    assert all(s in alone["stage_seconds"] for s in stages)
    cost = compression_cost(pd.DataFrame([deeper, again]))["time_s"].tolist()
    assert cost == pytest.approx(
        [
            deeper["time_capture_s"] + deeper["time_reused_s"] + deeper["time_estimate_s"],
            measured + again["time_estimate_s"],
        ]
    )


@pytest.mark.slow
def test_the_calibration_token_counts_the_docs_state_are_the_methods_tables(tmp_path):
    """docs/methods/sleb.md and the methods template state the methods table's calibration in tokens
    (the cost of SLEB's search scales with it): the non-padding tokens of that calibration, built as a
    job builds it for SmolLM2 (the model's shipped answers to the shipped prompts, offline)."""
    import re

    from helpers.config import CACHE, ROOT, typed

    from replaceme_exp.data.calibration import Answerer, build_calibration
    from replaceme_exp.models import load_model

    config = typed(["+methods=equal_compression", "model=smollm2_135m", "experiment=sleb"])
    assert (config.calibration.name, config.calibration.n_samples, config.calibration.seq_len) == (
        "self_generated",
        128,
        256,
    )
    loaded = load_model(config.model, str(CACHE))
    answerer = Answerer(loaded.model, loaded.identity_hash, str(tmp_path))  # no cached answers: the shipped ones
    tokens = build_calibration(config.calibration, loaded.tokenizer, answerer).n_tokens

    def stated(path: str, pattern: str) -> list[int]:
        text = " ".join((ROOT / path).read_text().split())
        return [int(n.replace(",", "")) for n in re.findall(pattern, text)]

    sleb_md = stated("docs/methods/sleb.md", r"128 chats of up to 256 tokens, ([\d,]+) tokens")
    template = stated("multirun_templates/methods/equal_compression.yaml", r"over the ([\d,]+) calibration tokens")
    assert sleb_md == [tokens] and template == [tokens]
    assert stated("docs/methods/sleb.md", r"every method sees the same tokens \(([\d,]+),") == [tokens]
    # the official calibration is scored in whole 2048-token windows: about 8k tokens in about 4 windows
    text = " ".join((ROOT / "docs/methods/sleb.md").read_text().split())
    windows, scored = re.search(r"scores about (\d) windows \(([\d,]+) tokens\)", text).groups()
    assert int(windows) * 2048 == int(scored.replace(",", "")) and "8 times as many" not in text
