"""Estimators built by ``_target_`` from the ``objective`` config group."""

from __future__ import annotations

import torch

from replaceme_exp.capture.statistics import LinearStats
from replaceme_exp.estimation.least_squares import ridge_solve


class Estimator:
    """Maps a cut's statistics to its transform T, (hidden, hidden) float64, or None for T = I
    with nothing fused."""

    name: str = "estimator"
    needs_statistics: bool = True

    def estimate(self, stats: LinearStats | None, alpha: float) -> torch.Tensor | None:
        raise NotImplementedError


class LeastSquaresEstimator(Estimator):
    """Closed-form LS (ReplaceMe's L2 objective); ridge when ``alpha > 0``."""

    name = "ls"

    def __init__(self, name: str = "ls", max_condition: float = 1e13):
        self.name, self.max_condition = name, max_condition

    def estimate(self, stats: LinearStats | None, alpha: float) -> torch.Tensor:
        return ridge_solve(stats, alpha=alpha, max_condition=self.max_condition)


class IdentityEstimator(Estimator):
    """T = I: the blocks are removed and nothing is fused (the UIDL baseline without healing)."""

    name = "identity"
    needs_statistics = False

    def __init__(self, name: str = "identity"):
        self.name = name

    def estimate(self, stats: LinearStats | None, alpha: float) -> None:
        return None
