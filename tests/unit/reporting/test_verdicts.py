"""Comparisons read against margins fixed in advance (replaceme_exp/reporting/verdicts.py), and intervals
that hold for several variants at once (max-T) when a claim picks the best of them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers.tables import measured

from replaceme_exp.intervals import (
    Comparison,
    paired_perplexity,
    simultaneous_means,
    simultaneous_perplexity,
)
from replaceme_exp.reporting import verdicts
from replaceme_exp.reporting.paired import margins_given, paired_table, to_markdown


def c(low: float, high: float) -> Comparison:
    return Comparison((low + high) / 2, low, high, "test")


@pytest.mark.parametrize(
    "low, high, higher, expected",
    [
        (0.001, 0.03, True, "ahead"),
        (-0.015, 0.01, True, "level"),  # a deficit over 2 points is excluded
        (-0.019, -0.001, True, "level"),  # worse beyond noise, but within the margin
        (-0.05, -0.03, True, "behind"),
        (-0.03, 0.01, True, "inconclusive"),  # the interval reaches past the margin and past 0
        (-0.03, -0.001, True, "behind"),
        (-0.03, -0.001, False, "ahead"),  # lower is better (a log ratio of perplexities)
        (0.001, 0.03, False, "behind"),
    ],
)
def test_a_comparison_reads_ahead_level_behind_or_inconclusive(low, high, higher, expected):
    assert verdicts.read(c(low, high), higher, 0.02) == expected


def test_a_wider_interval_no_longer_makes_level_easier():
    """Under "the interval covers 0" a wider interval turned behind into a tie; against a margin it turns
    level into inconclusive."""
    assert verdicts.read(c(-0.01, 0.005), True, 0.02) == "level"
    assert verdicts.read(c(-0.06, 0.04), True, 0.02) == "inconclusive"


def test_the_shipped_margins_and_their_scales():
    assert verdicts.margin_on_comparison_scale("ppl_heldout") == pytest.approx(math.log(1.05))
    assert verdicts.margin_on_comparison_scale("avg_acc") == 0.02
    assert verdicts.margin_on_comparison_scale("score_replaceme_world_mc") == 0.02
    assert verdicts.margin_on_comparison_scale("decode_b1_speedup") == pytest.approx(math.log(1.05))
    assert verdicts.margin_on_comparison_scale("cos_dist_after") is None
    assert verdicts.margin_text("ppl_heldout") == "ratio 1.05" and verdicts.margin_text("avg_acc") == "2 points"
    given = margins_given(["avg_acc=0.01", "ppl_heldout=1.1"])
    assert given["avg_acc"] == {"kind": "difference", "value": 0.01} and given["ppl_heldout"]["value"] == 1.1
    for bad in (["ppl_heldout=0.9"], ["avg_acc=-1"], ["avg_acc=x"]):
        with pytest.raises(SystemExit, match="--margin"):
            margins_given(bad)


def test_max_t_intervals_cover_every_variant_at_once_about_95_percent_of_the_time():
    """Eight variants equal in truth to the reference, each scored on its own noise: the max-T intervals
    cover all eight at once in about 95% of trials, one-at-a-time intervals far less often."""
    rng = np.random.default_rng(0)
    tokens = np.full(40, 200.0)
    joint, alone = 0, 0
    trials = 150
    for trial in range(trials):
        level = rng.gamma(8.0, 0.4, 40) * tokens
        reference = level + rng.normal(0, 20, 40)
        variants = [level + rng.normal(0, 20, 40) for _ in range(8)]
        found = simultaneous_perplexity(variants, reference, tokens, resamples=600, seed=trial)
        joint += all(x.low <= 0 <= x.high for x in found)
        alone += all(
            (p := paired_perplexity(v, reference, tokens, resamples=600, seed=trial)).low <= 0 <= p.high
            for v in variants
        )
    assert joint / trials >= 0.88 and alone / trials < 0.8


def test_simultaneous_means_are_wider_than_one_comparison_and_keep_the_estimates():
    rng = np.random.default_rng(1)
    reference = [(rng.random(300) < 0.6).astype(float), (rng.random(200) < 0.5).astype(float)]
    variants = [[np.where(rng.random(len(r)) < 0.1, 1 - r, r) for r in reference] for _ in range(6)]
    found = simultaneous_means(variants, reference)
    from replaceme_exp.intervals import paired_means

    for v, joint in zip(variants, found):
        own = paired_means(v, reference)
        assert joint.estimate == pytest.approx(own.estimate)
        assert (joint.high - joint.low) > 1.2 * (own.high - own.low)
        assert "max-T" in joint.method


def test_the_picked_variants_of_a_cell_get_simultaneous_intervals():
    frame = pd.DataFrame(
        [
            measured(1, "SLEB", 1.00, (300, 200)),
            *(measured(i, "ReplaceMe LS", 1.0 + 0.002 * i, (300, 200), noise=0.03, alpha=i) for i in range(2, 8)),
            measured(9, "ShortGPT", 1.01, (300, 200), noise=0.03),
        ]
    )
    alone = paired_table(frame, "SLEB").set_index("label")
    picked = paired_table(frame, "SLEB", picked="ReplaceMe").set_index("label")
    for label in picked.index:
        if label.startswith("ReplaceMe"):
            assert picked.loc[label, "ppl_heldout_simultaneous"]
            width = picked.loc[label, "ppl_heldout_vs_high"] / picked.loc[label, "ppl_heldout_vs_low"]
            assert width > alone.loc[label, "ppl_heldout_vs_high"] / alone.loc[label, "ppl_heldout_vs_low"]
        else:
            assert not picked.loc[label, "ppl_heldout_simultaneous"]
            assert picked.loc[label, "ppl_heldout_vs_low"] == alone.loc[label, "ppl_heldout_vs_low"]
    text = to_markdown(picked.reset_index(), "SLEB")
    assert "Margins (fixed in advance): ppl_heldout: ratio 1.05, avg_acc: 2 points" in text and "]* " in text


def test_runs_of_one_setting_on_several_draws_are_one_row_compared_over_the_draws():
    """Three calibration draws of each setting (one setting_hash): one row each, its value the mean over
    the draws, its comparison paired draw by draw; picked variants on several draws get a Bonferroni level."""
    rows = []
    for draw in range(3):
        rows.append(measured(10 + draw, "SLEB", 1.00 + 0.01 * draw, (300, 200), calibration_draw=draw, seed=42))
        for k, scale in enumerate((1.01, 1.2)):
            rows.append(
                measured(
                    20 + 3 * k + draw,
                    "ReplaceMe LS",
                    scale + 0.01 * draw,
                    (300, 200),
                    calibration_draw=draw,
                    seed=42,
                    alpha=k,
                    setting_hash=f"ls{k}",
                )
            )
    frame = pd.DataFrame(rows)
    frame.loc[frame["method"] == "SLEB", "setting_hash"] = "sleb"
    table = paired_table(frame, "SLEB", picked="ReplaceMe").set_index("label")
    assert len(table) == 2 and set(table["runs"]) == {3}
    near, far = table.iloc[0], table.iloc[1]
    assert "3 draws" in near["ppl_heldout_vs_method"] and near["ppl_heldout_simultaneous"]
    assert near["ppl_heldout_verdict"] == "level" and far["ppl_heldout_verdict"] == "behind"
    alone = paired_table(frame, "SLEB").set_index("label")
    width = near["ppl_heldout_vs_high"] / near["ppl_heldout_vs_low"]
    assert width > alone.iloc[0]["ppl_heldout_vs_high"] / alone.iloc[0]["ppl_heldout_vs_low"]
    assert "(3 runs)" in to_markdown(table.reset_index(), "SLEB")


def test_the_best_peer_is_the_best_non_variant_setting_on_each_metric():
    frame = pd.DataFrame(
        [
            measured(1, "SLEB", 1.00, (300, 200)),  # best perplexity among the peers
            measured(2, "LinearPatch", 1.02, (320, 200)),  # best accuracy among the peers
            measured(3, "ReplaceMe LS", 0.99, (318, 200), noise=0.01),
        ]
    )
    table = paired_table(frame, "best-peer", picked="ReplaceMe").set_index("label")
    assert table.loc["SLEB", "ppl_heldout_verdict"] == "reference"
    assert table.loc["LinearPatch", "avg_acc_verdict"] == "reference"
    variant = table.loc["ReplaceMe LS"]
    assert variant["ppl_heldout_vs"] == pytest.approx(variant["ppl_heldout"] / table.loc["SLEB", "ppl_heldout"])
    assert variant["avg_acc_vs"] == pytest.approx(variant["avg_acc"] - table.loc["LinearPatch", "avg_acc"])
    with pytest.raises(SystemExit, match="--picked"):
        from replaceme_exp.reporting.paired import main

        main(["--results", ".", "--reference", "best-peer"])
