"""The ridge toward the identity (``objective=ls_ridge_identity``) against independent computations:
the closed form against lstsq on an augmented system, the fold statistics against captures of the
folds' own sequences, the held-out residuals and GCV from statistics against brute force over the
activations, the chosen strength against a brute-force grid search, and a tiny job end to end."""

from __future__ import annotations

import pytest
import torch
from helpers.config import compose_config
from helpers.jobs import SMOKE
from helpers.ridge_identity import FOLDS

from replaceme_exp.capture import LinearStats
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.folds import FoldedStats, StoredFoldedStats
from replaceme_exp.capture.statistics import StoredLinearStats
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.ridge_identity import RidgeToIdentityEstimator
from replaceme_exp.pipeline.spec import JobSpec


def test_noise_the_inputs_cannot_predict_falls_back_to_the_identity():
    """R = M + noise independent of M: T = I is the truth, and a full fit only learns the noise."""
    g = torch.Generator().manual_seed(0)
    folds = []
    for _ in range(FOLDS):
        m = torch.randn(12, 8, generator=g, dtype=torch.float64)
        r = m + torch.randn(12, 8, generator=g, dtype=torch.float64)
        folds.append(LinearStats((1, 2), m.T @ m, m.T @ r, float(r.pow(2).sum()), 12))
    estimator = RidgeToIdentityEstimator(grid_min=1e-4, grid_max=1e2, grid_points=7)
    assert estimator.estimate(FoldedStats.of(folds), alpha=0.0) is None  # nothing fused: plain removal
    columns = estimator.columns()
    assert columns["ridge_identity_fallback"] == {(1, 2): True}
    assert columns["ridge_lambda"] == {(1, 2): None} and columns["ridge_lambda_relative"] == {(1, 2): None}
    assert columns["ridge_heldout_residual"] == columns["ridge_heldout_residual_identity"]


def test_fold_entries_never_meet_plain_entries_in_the_cache(tmp_path):
    cache = StatisticsCache(tmp_path, "model", "data")
    eye = torch.eye(4, dtype=torch.float64)
    parts = [LinearStats((1, 3), eye * (i + 1), eye, 1.0, 5) for i in range(3)]
    cache.store(StoredFoldedStats.of(FoldedStats.of(parts)))
    assert cache.read(StoredLinearStats((1, 3))) is None and cache.read(StoredFoldedStats((1, 3), folds=2)) is None
    got = cache.read(StoredFoldedStats((1, 3), folds=3))
    assert [p.mtm[0, 0].item() for p in got.folds] == [1.0, 2.0, 3.0] and got.n_tokens == 15
    cache.store(StoredLinearStats.of(LinearStats((1, 3), eye, eye, 1.0, 5)))
    assert cache.read(StoredFoldedStats((1, 3), folds=3)).mtm[0, 0].item() == 6.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["calibration.n_samples=3"], "calibration.n_samples=3: fewer than the 5 folds"),
        (["mask_ratio=0.25"], "mask_ratio=0.25: not with objective=ls_ridge_identity"),
        (["objective.folds=1"], "objective.folds=1: must be an integer >= 2"),
        (["structure=diagonal"], "objective=ls_ridge_identity supports generic"),
    ],
)
def test_bad_settings_are_refused_before_anything_loads(overrides, message):
    with pytest.raises(ConfigError, match=message):
        JobSpec.from_config(compose_config(SMOKE + ["experiment=ls_ridge_identity", *overrides]))


def test_alpha_does_not_act_and_the_settings_are_row_columns():
    spec = JobSpec.from_config(compose_config(SMOKE + ["experiment=ls_ridge_identity", "alpha=5"]))
    plain = JobSpec.from_config(compose_config(SMOKE + ["experiment=ls_ridge_identity"]))
    assert spec.config_hash == plain.config_hash
    columns = spec.setting_columns()
    assert columns["alpha"] == 0 and columns["regularizer"] == "none" and columns["method"] == "ReplaceMe LS ridge-to-I"
    assert columns["ridge_criterion"] == "sequence_folds" and columns["ridge_folds"] == 5
    assert columns["ridge_grid"] == [1e-6, 1e3, 19]
    other = JobSpec.from_config(compose_config(SMOKE + ["experiment=ls_ridge_identity", "objective.folds=4"]))
    assert other.config_hash != plain.config_hash
    ls = JobSpec.from_config(compose_config(SMOKE)).setting_columns()
    assert ls["ridge_criterion"] is None and ls["ridge_folds"] is None and ls["ridge_grid"] is None
