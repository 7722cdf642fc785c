"""What a task's items can show (replaceme_exp/evaluation/item_floors.py): chance, the trivial baseline
against a brute-force leave-one-out vote and the issue's measured 0.428 on the world facts, clusters, and
intervals drawn by cluster."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from replaceme_exp.evaluation.harness import collect_items
from replaceme_exp.intervals import mean_interval, paired_means, stratified_means
from replaceme_exp.evaluation.item_floors import CEILING, Item, chance, cluster_codes, item_of, majority, score_range
from replaceme_exp.evaluation.offline_items import OFFLINE_TASKS


def world_items() -> list[dict]:
    return [json.loads(line) for line in (OFFLINE_TASKS / "world_mc.jsonl").read_text().splitlines()]


def brute_force_majority(items: list[Item], draws: int, seed: int) -> float:
    """The baseline played out: each item answered with a choice the most other items have as gold,
    ties broken by a seeded coin, averaged over ``draws`` plays."""
    rng = random.Random(seed)
    right = 0
    for _ in range(draws):
        for k, item in enumerate(items):
            votes = {c: sum(1 for j, other in enumerate(items) if j != k and other.gold == c) for c in item.choices}
            best = max(votes.values())
            right += rng.choice([c for c, v in votes.items() if v == best]) == item.gold
    return right / (draws * len(items))


def test_always_the_answer_most_frequent_elsewhere_scores_0_428_on_the_world_facts():
    items = [Item(d["choices"][d["answer"]], tuple(d["choices"])) for d in world_items()]
    assert len(items) == 588 and chance(items) == 0.25
    assert majority(items) == pytest.approx(0.4281, abs=5e-5)  # the figure issue 49 measured
    assert len(set(cluster_codes(items, "answer"))) == 335
    subset = items[:60]
    assert majority(subset) == pytest.approx(brute_force_majority(subset, draws=40, seed=1), abs=0.02)


def test_a_generated_answer_has_no_chance_floor_and_votes_among_every_answer():
    items = [Item(t, None) for t in ["a", "a", "b", "c"]]
    assert chance(items) is None
    # "a" items: the other three golds are a, b, c (tied): 1/3 each; b and c: "a" twice wins: 0
    assert majority(items) == pytest.approx((1 / 3 + 1 / 3) / 4)


def test_item_of_reads_lm_evals_logged_samples():
    mc = {"target": 2, "arguments": [{"arg_0": "Q:", "arg_1": " x"}, {"arg_0": "Q:", "arg_1": " y"}, ("Q:", " z")]}
    assert item_of(mc) == Item("z", ("x", "y", "z"))
    by_text = {"target": " y", "arguments": [("Q:", " x"), ("Q:", " y")]}
    assert item_of(by_text) == Item("y", ("x", "y"))
    generated = {"target": " word", "arguments": [("context", {"until": ["\n"]})]}
    assert item_of(generated) == Item("word", None)
    greedy = {"target": " word", "arguments": [("context", " word")]}  # one continuation: a greedy match
    assert item_of(greedy) == Item("word", None)


def test_a_score_is_marked_at_its_floor_or_near_its_ceiling():
    assert score_range(0.45, 0.41, 0.428) == "floor"
    assert score_range(0.60, 0.55, 0.428) is None
    assert score_range(CEILING, 0.85, 0.5) == "ceiling"
    assert score_range(None, None, 0.5) is None


def test_items_sharing_an_answer_are_drawn_together_and_widen_the_interval():
    rng = np.random.default_rng(0)
    clusters = np.repeat(np.arange(30), 8)  # 30 answers, 8 items each: an answer known or not
    known = rng.random(30) < 0.6
    values = (known[clusters] ^ (rng.random(240) < 0.05)).astype(float)
    alone = mean_interval([values])
    together = mean_interval([values], clusters=[list(clusters)])
    assert (together[1] - together[0]) > 1.8 * (alone[1] - alone[0])
    # drawn cluster by cluster, independently: the mean of the drawn items
    draws = np.random.default_rng(7)
    ref = []
    for _ in range(4000):
        picked = draws.integers(0, 30, 30)
        ref.append(np.concatenate([values[clusters == c] for c in picked]).mean())
    low, high = np.quantile(ref, [0.025, 0.975])
    assert together[0] == pytest.approx(low, abs=0.02) and together[1] == pytest.approx(high, abs=0.02)
    reps = stratified_means([values, values], resamples=500, clusters=[list(clusters), None])
    assert reps.shape == (500,)


def test_a_paired_difference_drawn_by_answer_is_wider_than_by_item():
    rng = np.random.default_rng(3)
    clusters = list(np.repeat(np.arange(25), 6))
    a = (rng.random(150) < 0.7).astype(float)
    flips = np.repeat(rng.random(25) < 0.2, 6)  # b loses whole answers
    b = np.where(flips, 0.0, a)
    by_item = paired_means([a], [b])
    by_answer = paired_means([a], [b], clusters=[clusters])
    assert by_answer.estimate == pytest.approx(by_item.estimate)
    assert (by_answer.high - by_answer.low) > (by_item.high - by_item.low)
    assert "by cluster" in by_answer.method


def test_collect_items_records_floors_clusters_and_a_clustered_interval():
    def sample(i, gold, choices, acc):
        return {
            "doc_id": i,
            "doc_hash": f"h{i}",
            "filter": "none",
            "acc": acc,
            "target": gold,
            "arguments": [("Q:", f" {c}") for c in choices],
        }

    golds = ["Euro", "Euro", "Euro", "Yen", "Peso", "Euro"]
    choices = [["Euro", "Yen", "Peso", "Won"]] * 6
    samples = [sample(i, choices[i].index(g), choices[i], float(i % 2)) for i, g in enumerate(golds)]
    out = {"samples": {"world": samples}, "group_subtasks": {}, "n-samples": {}}
    columns = collect_items(out, {"world": "acc"}, {"world": "answer"})
    assert columns["item_clusters_world"] == [0, 0, 0, 1, 2, 0]
    assert columns["floor_chance_world"] == 0.25
    # Euro items: the others' golds are 3 Euro + Yen + Peso -> Euro (4 of them right); Yen, Peso: Euro -> wrong
    assert columns["floor_majority_world"] == pytest.approx(4 / 6)
    low, high = mean_interval([np.array([float(i % 2) for i in range(6)])], clusters=[[0, 0, 0, 1, 2, 0]])
    assert (columns["score_world_ci_low"], columns["score_world_ci_high"]) == (low, high)
    assert (columns["avg_acc_ci_low"], columns["avg_acc_ci_high"]) == (low, high)
    assert columns["score_range_world"] == "floor"
    plain = collect_items(out, {"world": "acc"})
    assert plain["item_clusters_world"] is None
