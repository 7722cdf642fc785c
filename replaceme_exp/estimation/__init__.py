"""Estimation: from capture statistics to one transform T per cut (None = identity)."""

from replaceme_exp.estimation.estimators import Estimator, IdentityEstimator, LeastSquaresEstimator
from replaceme_exp.estimation.least_squares import ridge_solve

__all__ = ["Estimator", "IdentityEstimator", "LeastSquaresEstimator", "ridge_solve"]
