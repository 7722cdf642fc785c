"""Intervals of recorded numbers and paired comparisons (replaceme_exp/intervals.py), against
independent computations: a bootstrap drawn index by index, the coverage of a known distribution,
hand-computed differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replaceme_exp.intervals import (
    mean_interval,
    paired_means,
    paired_perplexity,
    perplexity_interval,
    resampled_sums,
    stderr_from_interval,
    unpaired,
    z_value,
)


def windows(n: int, seed: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows of 255 tokens whose mean per-token NLL varies from window to window (topics)."""
    rng = np.random.default_rng(seed)
    tokens = np.full(n, 255.0)
    per_token = rng.gamma(shape=20.0, scale=0.15, size=n) * scale  # mean 3 nats, spread between windows
    return per_token * tokens, tokens


def index_bootstrap(nll, tokens, resamples: int, seed: int) -> tuple[float, float]:
    """The same percentile interval, drawn the textbook way: indices with replacement, one resample at a time."""
    rng = np.random.default_rng(seed)
    n = len(nll)
    values = []
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        values.append(math.exp(nll[idx].sum() / tokens[idx].sum()))
    return tuple(np.quantile(values, [0.025, 0.975]))


def test_the_perplexity_interval_agrees_with_a_bootstrap_drawn_index_by_index():
    nll, tokens = windows(32, seed=1)
    low, high = perplexity_interval(nll, tokens, resamples=20000, seed=3)
    ref_low, ref_high = index_bootstrap(nll, tokens, 20000, seed=4)
    point = math.exp(nll.sum() / tokens.sum())
    assert low < point < high
    assert low == pytest.approx(ref_low, rel=0.01) and high == pytest.approx(ref_high, rel=0.01)


def test_resampled_sums_draw_the_same_units_for_every_quantity():
    values = np.stack([np.arange(10.0), 2 * np.arange(10.0)])
    sums = resampled_sums(values, resamples=300, seed=0)
    assert sums.shape == (300, 2)
    np.testing.assert_allclose(sums[:, 1], 2 * sums[:, 0])  # paired: the same draw for both rows
    assert sums[:, 0].mean() == pytest.approx(45.0, rel=0.05)  # n * mean


def test_the_perplexity_interval_covers_the_true_perplexity_about_95_percent_of_the_time():
    """Windows drawn from a known distribution: the true perplexity is exp(E[nll] / E[tokens]) = exp(3)."""
    covered = 0
    trials = 200
    for trial in range(trials):
        nll, tokens = windows(32, seed=100 + trial)
        low, high = perplexity_interval(nll, tokens, resamples=1000, seed=trial)
        covered += low <= math.exp(3.0) <= high
    assert 0.88 <= covered / trials <= 0.99


def test_the_interval_narrows_with_more_windows():
    few = perplexity_interval(*windows(16, seed=5))
    many = perplexity_interval(*windows(256, seed=5))
    assert (many[1] - many[0]) < 0.5 * (few[1] - few[0])  # about 1/sqrt(16) as wide


def test_a_paired_comparison_of_one_model_with_itself_is_a_tie_at_zero():
    nll, tokens = windows(32, seed=7)
    same = paired_perplexity(nll, nll.copy(), tokens)
    assert same.estimate == 0.0 and same.low == 0.0 and same.high == 0.0 and same.tie


def test_pairing_separates_a_consistent_small_difference_that_unpaired_intervals_cannot():
    """Model B is 2% worse on every window: the windows' own spread hides it from two separate
    intervals, not from the paired difference."""
    nll, tokens = windows(32, seed=8)
    worse = nll * 1.02
    paired = paired_perplexity(worse, nll, tokens)
    assert paired.estimate == pytest.approx(math.log(math.exp(worse.sum() / tokens.sum())) - nll.sum() / tokens.sum())
    assert not paired.tie and paired.low > 0
    a, b = perplexity_interval(worse, tokens), perplexity_interval(nll, tokens)
    assert a[0] < b[1]  # the two intervals overlap
    se = [stderr_from_interval(math.log(lo), math.log(hi)) for lo, hi in (a, b)]
    assert unpaired(math.log(math.exp(worse.sum() / 8160)), se[0], math.log(math.exp(nll.sum() / 8160)), se[1]).tie


def test_paired_items_give_the_difference_of_task_means_and_tie_on_a_few_flips():
    rng = np.random.default_rng(0)
    a = [rng.integers(0, 2, 600).astype(float), rng.integers(0, 2, 400).astype(float)]
    b = [x.copy() for x in a]
    b[0][:3] = 1 - b[0][:3]  # three items of 1,000 flipped
    comparison = paired_means(a, b)
    expected = np.mean([a[0].mean() - b[0].mean(), a[1].mean() - b[1].mean()])
    assert comparison.estimate == pytest.approx(expected) and comparison.units == 1000
    assert comparison.tie
    c = [x.copy() for x in a]
    c[0][a[0] == 1] = 0.0  # every item task 1 got right lost
    assert not paired_means(a, c).tie and paired_means(a, c).low > 0


def test_paired_items_must_be_the_same_items():
    with pytest.raises(ValueError, match="differ in number"):
        paired_means([np.ones(5)], [np.ones(6)])


def test_the_mean_interval_is_stratified_by_task():
    """A task of constant items has no spread: the interval of the mean comes from the other task alone."""
    rng = np.random.default_rng(1)
    varying = rng.integers(0, 2, 500).astype(float)
    low, high = mean_interval([np.ones(500), varying], resamples=4000)
    se = varying.std() / math.sqrt(500) / 2  # the mean of two task means
    center = (1.0 + varying.mean()) / 2
    assert low == pytest.approx(center - z_value() * se, abs=0.006)
    assert high == pytest.approx(center + z_value() * se, abs=0.006)


def test_unpaired_comparison_uses_both_standard_errors():
    c = unpaired(0.70, 0.01, 0.66, 0.01)
    assert c.estimate == pytest.approx(0.04)
    assert c.high - c.low == pytest.approx(2 * 1.959964 * math.sqrt(2) * 0.01, rel=1e-5)
    assert not c.tie and unpaired(0.70, 0.02, 0.66, 0.02).tie
