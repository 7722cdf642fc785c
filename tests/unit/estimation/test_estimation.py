"""Closed-form LS and ridge against torch.linalg.lstsq on explicitly collected activations."""

from __future__ import annotations

import pytest
import torch

from replaceme_exp.capture import LinearStats
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation import LeastSquaresEstimator, ridge_solve


def test_too_few_tokens_says_how_many_are_needed():
    m = torch.randn(10, 32, dtype=torch.float64)
    stats = LinearStats((1, 3), m.T @ m, m.T @ m, 1.0, 10)
    with pytest.raises(ConfigError, match="at least 32 are needed"):
        ridge_solve(stats)
    assert ridge_solve(stats, alpha=1.0).shape == (32, 32)  # ridge makes it well posed


def test_singular_and_ill_conditioned_systems_suggest_alpha():
    m = torch.randn(100, 32, dtype=torch.float64)
    m[:, 5] = m[:, 4]  # exactly collinear columns
    with pytest.raises(ConfigError, match="alpha"):
        ridge_solve(LinearStats((1, 3), m.T @ m, m.T @ m, 1.0, 100))
    m[:, 5] += 1e-9 * torch.randn(100, dtype=torch.float64)
    with pytest.raises(ConfigError, match="ill-conditioned|singular"):
        LeastSquaresEstimator().estimate(LinearStats((1, 3), m.T @ m, m.T @ m, 1.0, 100), 0.0)
    assert torch.isfinite(ridge_solve(LinearStats((1, 3), m.T @ m, m.T @ m, 1.0, 100), alpha=1e-2)).all()
