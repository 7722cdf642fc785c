"""Several calibration draws of one setting: two-level intervals (draws and evaluation units resampled
together) against a bootstrap drawn level by level, comparisons paired over the same draws, and what a
table cell shows (the mean, its interval, the spread between draws, the blocks each draw removed)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers.tables import measured

from replaceme_exp.intervals import draws_perplexity, paired_draws_means, paired_draws_perplexity
from replaceme_exp.reporting.paper_tables import draws_line, format_cell
from replaceme_exp.reporting.ties import Cell, compare_cells, draws_interval


def draws(k: int, n_documents: int, seed: int, spread: float):
    """k draws' per-window NLL on the same documents (2 windows each): a draw moves every window by its
    own factor (another calibration sample, another transform), documents differ by topic."""
    rng = np.random.default_rng(seed)
    tokens = np.full(2 * n_documents, 200.0)
    topic = np.repeat(rng.gamma(8.0, 0.4, n_documents), 2)
    documents = [f"d{i // 2}" for i in range(2 * n_documents)]
    nll = np.stack([topic * (1 + spread * rng.standard_normal()) * tokens for _ in range(k)])
    return nll, tokens, documents


def two_level_by_hand(nll, tokens, documents, resamples: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    names = sorted(set(documents))
    where = {n: [i for i, d in enumerate(documents) if d == n] for n in names}
    values = []
    for _ in range(resamples):
        idx = [i for n in rng.choice(names, len(names)) for i in where[n]]
        drawn = rng.integers(0, nll.shape[0], nll.shape[0])
        values.append(np.mean([math.exp(nll[d, idx].sum() / tokens[idx].sum()) for d in drawn]))
    return tuple(np.quantile(values, [0.025, 0.975]))


def test_the_mean_over_draws_and_its_interval_agree_with_a_bootstrap_drawn_level_by_level():
    nll, tokens, documents = draws(4, 20, seed=0, spread=0.05)
    mean, low, high = draws_perplexity(nll, tokens, resamples=8000, seed=1, clusters=documents)
    assert mean == pytest.approx(np.mean(np.exp(nll.sum(axis=1) / tokens.sum())))
    ref_low, ref_high = two_level_by_hand(nll, tokens, documents, 3000, seed=2)
    assert low == pytest.approx(ref_low, rel=0.03) and high == pytest.approx(ref_high, rel=0.03)
    # the draws' spread widens it beyond one draw's evaluation interval
    still, s_low, s_high = draws_perplexity(nll[:1].repeat(4, axis=0), tokens, resamples=4000, clusters=documents)
    assert (high - low) / mean > (s_high - s_low) / still


def test_a_comparison_over_the_same_draws_pairs_them_draw_by_draw():
    nll, tokens, documents = draws(3, 20, seed=3, spread=0.08)
    worse = nll * 1.03  # every draw 3% worse on every window
    pair = paired_draws_perplexity(worse, nll, tokens, clusters=documents)
    per_draw = 0.03 * nll.sum(axis=1) / tokens.sum()  # log(ppl ratio) = the difference of mean NLL per token
    assert pair.estimate == pytest.approx(per_draw.mean(), rel=1e-9)
    assert 0 < pair.low < pair.estimate < pair.high and "3 draws" in pair.method
    items_a = [[np.r_[np.ones(30), np.zeros(10)]], [np.r_[np.ones(28), np.zeros(12)]]]
    items_b = [[np.r_[np.ones(25), np.zeros(15)]], [np.r_[np.ones(26), np.zeros(14)]]]
    found = paired_draws_means(items_a, items_b)
    assert found.estimate == pytest.approx(((30 - 25) + (28 - 26)) / 2 / 40)


def test_cells_of_several_draws_are_compared_over_their_draws_and_show_the_spread():
    a = pd.DataFrame(
        [measured(i, "SLEB", 1.0 + 0.01 * i, (300, 200), calibration_draw=i, seed=42, cuts=[[6, 10]]) for i in range(3)]
    )
    b = pd.DataFrame(
        [
            measured(i + 10, "ShortGPT", 1.1 + 0.01 * i, (290, 200), calibration_draw=i, seed=42, cuts=[[4, 8]])
            for i in range(3)
        ]
    )
    cell_a, cell_b = (Cell(float(f["ppl_heldout"].mean()), f) for f in (a, b))
    comparison = compare_cells(cell_b, cell_a, "ppl_heldout")
    assert "draws" in comparison.method and comparison.low > 0  # ShortGPT behind on every draw
    # draws that differ: compared on those both have, paired draw by draw, and said so
    unmatched = b.assign(calibration_draw=[0, 1, 5])
    shared = compare_cells(Cell(float(unmatched["ppl_heldout"].mean()), unmatched), cell_a, "ppl_heldout")
    first_two = (Cell(float(f.iloc[:2]["ppl_heldout"].mean()), f.iloc[:2]) for f in (b, a))
    on_two = compare_cells(*first_two, "ppl_heldout")
    assert shared.method.endswith("on the 2 calibration draw(s) both have") and "2 draws" in shared.method
    assert (shared.estimate, shared.low, shared.high) == (on_two.estimate, on_two.low, on_two.high)
    one = compare_cells(Cell(float(unmatched["ppl_heldout"].mean()), unmatched), Cell(1.0, a.iloc[:1]), "ppl_heldout")
    alone = compare_cells(Cell(1.1, b.iloc[:1]), Cell(1.0, a.iloc[:1]), "ppl_heldout")
    assert one.method.endswith("on the 1 calibration draw(s) both have") and one.estimate == alone.estimate
    interval = draws_interval(a, "ppl_heldout")
    assert interval is not None and interval[0] < a["ppl_heldout"].mean() < interval[1]
    shown = format_cell(a["ppl_heldout"], interval)
    assert shown.endswith("(n=3)") and " [" in shown and " ± " in shown
    mixed = a.assign(cuts=[[[6, 10]], [[6, 10]], [[5, 9]]])
    assert (
        draws_line("SLEB", mixed)
        == "SLEB: blocks removed by each of its 3 runs: [6,10) (draw 0; draw 1), [5,9) (draw 2)"
    )
    assert draws_line("SLEB", a.iloc[:1]) is None
