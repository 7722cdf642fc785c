"""Speed per architecture (replaceme_exp/evaluation/architecture.py): pruned models with the same
architecture share a signature and a speed figure, measured by a few jobs and then reused; analytic FLOPs
against a hand count; a table shows one figure per architecture with the spread between its jobs."""

from __future__ import annotations

import pytest
from helpers.models import tiny_model
from helpers.tables import frame, smollm2_run

from replaceme_exp.evaluation.architecture import SpeedStore, forward_flops_per_token
from replaceme_exp.evaluation.speed import across_jobs
from replaceme_exp.reporting.paper_tables import SPEED_CONDITIONS, architecture_runs, build_table


def test_forward_flops_count_every_linear_layer_and_attention_by_hand():
    model = tiny_model("llama", num_layers=2, seed=0)
    cfg = model.config
    d, inter, heads, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or d // heads
    per_layer = d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d + 3 * d * inter
    linear = cfg.num_hidden_layers * per_layer + d * cfg.vocab_size  # the LM head
    context = (64 + 1) / 2
    expected = 2 * linear + cfg.num_hidden_layers * 4 * context * heads * head_dim
    assert forward_flops_per_token(model, 64) == pytest.approx(expected)


def test_the_store_keeps_each_jobs_measurement_and_a_damaged_entry_counts_as_none(tmp_path):
    store = SpeedStore(tmp_path)
    key = {"speed_architecture": "a", "machine": {"device": "cpu"}}
    assert store.measured(key) == []
    store.add(key, {"speed_decode_b1_speedup": 1.2})
    assert [r["speed_decode_b1_speedup"] for r in store.add(key, {"speed_decode_b1_speedup": 1.4})] == [1.2, 1.4]
    assert store.measured({**key, "speed_architecture": "b"}) == []
    next(tmp_path.glob("speed-*.json")).write_text("{not json")
    assert store.measured(key) == []


def test_across_jobs_is_the_median_with_the_range_between_jobs():
    rows = [
        {"speed_decode_b1_speedup": v, "speed_decode_b1_tok_s": 10 * v, "speed_round_times": "x"}
        for v in (1.1, 1.4, 1.2)
    ]
    out = across_jobs(rows)
    assert out["speed_decode_b1_speedup"] == 1.2 and out["speed_decode_b1_tok_s"] == 12.0
    assert (out["speed_decode_b1_speedup_min"], out["speed_decode_b1_speedup_max"]) == (1.1, 1.4)
    assert out["speed_round_times"] is None and out["speed_prefill_speedup"] is None


def test_a_table_shows_one_speed_per_architecture_with_the_spread_between_its_jobs():
    from helpers.tables import SPECS, cells

    speed = {c: "x" for c in SPEED_CONDITIONS}
    runs = frame(
        smollm2_run(2, "ReplaceMe LS", ppl_heldout=90.0, **speed, speed_decode_b1_speedup=1.10, speed_reused=False),
        smollm2_run(
            3,
            "ReplaceMe LS",
            estimation_tokens="rescale_massive",
            ppl_heldout=70.0,
            **speed,
            speed_decode_b1_speedup=1.30,
            speed_reused=False,
        ),
        smollm2_run(4, "UIDL", ppl_heldout=900.0, **speed, speed_decode_b1_speedup=1.20, speed_reused=True),
    )
    assert len(architecture_runs(runs, runs.iloc[0])) == 2  # the reused run is no measurement
    table = build_table(SPECS["methods_equal_compression"], runs)
    shown = {label: cells(table, label)["Decode speedup (batch 1)"] for label in ("ReplaceMe LS", "UIDL")}
    assert shown["ReplaceMe LS"] == shown["UIDL"] and shown["UIDL"].strip("*") == "1.2 [1.1, 1.3] (2 jobs)"
    sink = cells(table, "ReplaceMe LS, sink-aware estimation")["Decode speedup (batch 1)"]
    assert sink == shown["UIDL"]  # the same architecture: the same figure, the same mark
