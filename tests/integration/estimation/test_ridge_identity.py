"""The ridge toward the identity (``objective=ls_ridge_identity``) against independent computations:
the closed form against lstsq on an augmented system, the fold statistics against captures of the
folds' own sequences, the held-out residuals and GCV from statistics against brute force over the
activations, the chosen strength against a brute-force grid search, and a tiny job end to end."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.explicit import explicit_blocks
from helpers.jobs import job_config
from helpers.models import tiny_model
from helpers.ridge_identity import CUT, D, FOLDS

from replaceme_exp.capture import LinearStatistics, TokenRule, run_capture
from replaceme_exp.capture.folds import FoldedLinearStatistics, FoldedStats
from replaceme_exp.estimation.least_squares import ridge_solve, ridge_to_identity_solve
from replaceme_exp.estimation.ridge_identity import choose, gcv_scores, heldout_residuals, relative_grid
from replaceme_exp.models import adapter_for
from replaceme_exp.runtime import run_recorded


GRID = relative_grid(1e-4, 1e2, 7)


@pytest.fixture(scope="module")
def captured():
    """Folded statistics of CUT on a tiny model and, per sequence, its explicit M and R rows (float64)."""
    model = tiny_model("llama", 5, seed=1)
    sequences = random_sequences(24, 8, 16, seed=5)
    folded = FoldedLinearStatistics([CUT], D, torch.device("cpu"), folds=FOLDS)
    run_capture(adapter_for(model), batches_of(sequences, 5), [folded])
    rows = []
    for seq in sequences:
        blocks = explicit_blocks(model, torch.tensor(seq))
        m = blocks[CUT[0] - 1]["M"].double()
        rows.append((m, blocks[CUT[1] - 1]["L"].double() - blocks[CUT[0] - 1]["Y"].double()))
    return model, sequences, folded.result()[CUT], rows


def fold_rows(rows, fold: int, held: bool):
    """The stacked (M, R) rows of the sequences in ``fold`` (``held``) or in the other folds."""
    chosen = [r for j, r in enumerate(rows) if (j % FOLDS == fold) == held]
    return torch.cat([m for m, _ in chosen]), torch.cat([r for _, r in chosen])


def augmented_fit(m: torch.Tensor, r: torch.Tensor, lam: float) -> torch.Tensor:
    """``argmin ||M T - R||^2 + lam ||T - I||^2`` as plain least squares on
    ``[M; sqrt(lam) I] T = [R; sqrt(lam) I]``."""
    root = math.sqrt(lam) * torch.eye(m.shape[1], dtype=torch.float64)
    return torch.linalg.lstsq(torch.cat([m, root]), torch.cat([r, root]), driver="gelsd").solution


def brute_heldout(rows, relative: float) -> float:
    """Summed held-out residual over the folds, each T fitted on the other folds' raw rows."""
    total = 0.0
    for fold in range(FOLDS):
        m, r = fold_rows(rows, fold, held=False)
        hm, hr = fold_rows(rows, fold, held=True)
        if math.isinf(relative):
            t = torch.eye(D, dtype=torch.float64)
        else:
            lam = relative * float((m * m).sum(0).mean())  # the fit's mean eigenvalue: trace(M^T M) / d
            t = torch.linalg.lstsq(m, r, driver="gelsd").solution if lam == 0 else augmented_fit(m, r, lam)
        total += float((hm @ t - hr).pow(2).sum())
    return total


@pytest.mark.parametrize("lam", [0.5, 20.0, 1e3])
def test_closed_form_is_least_squares_on_the_augmented_system(captured, lam):
    _, _, stats, rows = captured
    m, r = torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows])
    expected = augmented_fit(m, r, lam)
    torch.testing.assert_close(ridge_to_identity_solve(stats, lam), expected, rtol=1e-5, atol=1e-6)


def test_limits_are_plain_least_squares_and_the_identity(captured):
    _, _, stats, _ = captured
    torch.testing.assert_close(ridge_to_identity_solve(stats, 1e-9), ridge_solve(stats, 0.0), rtol=1e-6, atol=1e-7)
    huge = ridge_to_identity_solve(stats, 1e12 * float(stats.mtm.diagonal().mean()))
    torch.testing.assert_close(huge, torch.eye(D, dtype=torch.float64), rtol=0, atol=1e-9)


def test_fold_statistics_are_their_sequences_own_and_sum_to_all(captured):
    model, sequences, stats, _ = captured
    rule = TokenRule("rescale_massive", massive_threshold=2.0)  # a rule that reads each sequence's median
    folded = FoldedLinearStatistics([CUT], D, torch.device("cpu"), rule=rule, folds=FOLDS)
    whole = LinearStatistics([CUT], D, torch.device("cpu"), rule=rule)
    run_capture(adapter_for(model), batches_of(sequences, 5), [folded, whole])
    got, everything = folded.result()[CUT], whole.result()[CUT]
    assert isinstance(got, FoldedStats) and len(got.folds) == FOLDS
    for fold, part in enumerate(got.folds):  # sequence j in fold j % FOLDS, whatever batch it is in
        alone = LinearStatistics([CUT], D, torch.device("cpu"), rule=rule)
        own = [s for j, s in enumerate(sequences) if j % FOLDS == fold]
        run_capture(adapter_for(model), batches_of(own, 3), [alone])
        expected = alone.result()[CUT]
        assert part.n_tokens == expected.n_tokens == sum(len(s) for s in own)
        # other batches, other padding: the float32 model's activations agree to float32 precision
        for got_part, want in ((part.mtm, expected.mtm), (part.mtr, expected.mtr)):
            torch.testing.assert_close(got_part, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        assert part.r_sq == pytest.approx(expected.r_sq, rel=1e-6)
    assert got.n_tokens == everything.n_tokens
    torch.testing.assert_close(got.mtm, everything.mtm, rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(got.mtr, everything.mtr, rtol=1e-10, atol=1e-9)


def test_heldout_residuals_from_statistics_are_the_brute_force_ones(captured):
    _, _, stats, rows = captured
    from_stats = heldout_residuals(stats.folds, GRID)
    for relative, value in zip(GRID, from_stats):
        assert value == pytest.approx(brute_heldout(rows, relative), rel=1e-5), relative


def test_the_chosen_strength_is_the_brute_force_grid_minimum(captured):
    _, _, stats, rows = captured
    brute = {relative: brute_heldout(rows, relative) for relative in GRID}
    choice = choose(stats, GRID)
    assert choice.relative == min(brute, key=brute.get)
    n = sum(m.shape[0] for m, _ in rows)
    assert choice.heldout == pytest.approx(brute[choice.relative] / n, rel=1e-5)
    assert choice.heldout_ls == pytest.approx(brute[0.0] / n, rel=1e-5)
    assert choice.heldout_identity == pytest.approx(brute[math.inf] / n, rel=1e-5)
    assert choice.heldout <= min(choice.heldout_ls, choice.heldout_identity)


def test_gcv_is_its_definition_over_the_tokens(captured):
    _, _, stats, rows = captured
    m, r = torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows])
    n, scale = m.shape[0], float(stats.mtm.diagonal().mean())
    for relative, score in zip(GRID, gcv_scores(stats, GRID)):
        if math.isinf(relative):
            t, hat_trace = torch.eye(D, dtype=torch.float64), 0.0
        else:
            lam = relative * scale
            t = augmented_fit(m, r, lam) if lam else torch.linalg.lstsq(m, r, driver="gelsd").solution
            hat = m @ torch.linalg.solve(m.T @ m + lam * torch.eye(D, dtype=torch.float64), m.T)
            hat_trace = float(hat.trace())
        rss = float((m @ t - r).pow(2).sum())
        assert score == pytest.approx(rss / (n * D) / (1 - hat_trace / n) ** 2, rel=1e-5), relative


@pytest.mark.slow
def test_tiny_job_records_the_choice_and_reuses_the_fold_statistics(tmp_path):
    row = run_recorded(job_config(tmp_path, "experiment=ls_ridge_identity", "cuts=[[2,4]]", "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["objective"] == "ls_ridge_identity" and row["ridge_folds"] == 5
    heldout = row["ridge_heldout_residual"]["2-4"]
    assert heldout <= row["ridge_heldout_residual_identity"]["2-4"]
    assert heldout <= row["ridge_heldout_residual_ls"]["2-4"]
    assert isinstance(row["ridge_identity_fallback"]["2-4"], bool)
    fallback = row["ridge_identity_fallback"]["2-4"]
    assert (row["ridge_lambda_relative"]["2-4"] is None) == fallback
    assert ("transform_rms" in row) != fallback and row["time_estimate_s"] > 0 and row["time_capture_s"] > 0
    # another grid: another job, the same fold statistics (from the cache)
    grid = "objective.grid_points=7"
    again = run_recorded(job_config(tmp_path, "experiment=ls_ridge_identity", "cuts=[[2,4]]", "save_model=false", grid))
    assert again["status"] == "finished", again["error"]
    assert "statistics" in again["cached_stages"] and "statistics" not in row["cached_stages"]
    assert again["ridge_heldout_residual_identity"] == row["ridge_heldout_residual_identity"]
