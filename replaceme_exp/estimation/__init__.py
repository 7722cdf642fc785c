"""Estimation: from capture statistics to one transform T per cut (None = identity)."""

from replaceme_exp.estimation.estimators import Estimator, IdentityEstimator, LeastSquaresEstimator
from replaceme_exp.estimation.least_squares import ridge_solve
from replaceme_exp.registry import import_submodules

import_submodules(__name__)  # every estimator module (and the ls_residual selection metric) is loaded

__all__ = ["Estimator", "IdentityEstimator", "LeastSquaresEstimator", "ridge_solve"]
