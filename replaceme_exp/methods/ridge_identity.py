"""Closed-form LS with a ridge toward the identity whose strength the calibration data choose
(``objective=ls_ridge_identity``; this project's, beyond the paper): docs/methods/ridge-to-identity.md."""

from typing import Literal

from replaceme_exp.config.schema import Group, at_least_two, finite_positive, key, positive_int, register_shape
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.ridge_identity import RidgeToIdentityEstimator
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.methods.replaceme_ls import LeastSquaresObjectiveConfig, fitted_on


@register_shape("objective")
@Group
class RidgeToIdentityObjectiveConfig(LeastSquaresObjectiveConfig):
    """Closed-form LS with a ridge toward the identity whose strength the calibration data choose
    (``objective=ls_ridge_identity``: docs/methods/ridge-to-identity.md)."""

    criterion: Literal["sequence_folds", "gcv"] = key(
        "sequence_folds", doc="choose the strength on held-out folds of whole sequences, or by GCV over tokens"
    )
    folds: int = key(5, doc="folds of whole calibration sequences (>= 2)", check=at_least_two)
    grid_min: float = key(1.0e-6, doc="smallest strength tried, times the mean eigenvalue", check=finite_positive)
    grid_max: float = key(1.0e3, doc="largest strength tried, times the mean eigenvalue", check=finite_positive)
    grid_points: int = key(19, doc="log-spaced strengths tried (and 0 = LS, inf = identity)", check=positive_int)


def folds_hold_sequences(c, needs) -> None:
    """The statistics are kept per fold of whole sequences: a sequence in every fold, and sequences
    that are one each (no masked copy, no padded row)."""
    name, folds = c.objective.name, needs.statistic_folds
    if c.calibration.n_samples < folds:
        reason = f"fewer than the {folds} folds of objective={name} (objective.folds)"
        raise ConfigError("calibration.n_samples", c.calibration.n_samples, reason)
    if float(c.mask_ratio):
        reason = f"not with objective={name}: a masked copy of a sequence would fall into another fold than it"
        raise ConfigError("mask_ratio", float(c.mask_ratio), reason)
    if c.estimation.padded_positions:
        reason = f"not with objective={name}: padded positions belong to no sequence of a fold"
        raise ConfigError("estimation.padded_positions", True, reason)


def strength_choice(c) -> dict:
    """How the strength is chosen: the criterion, the folds, the grid ``[min, max, points]``."""
    o = c.objective
    grid = [float(o.grid_min), float(o.grid_max), int(o.grid_points)]
    return {"ridge_criterion": o.criterion, "ridge_folds": int(o.folds), "ridge_grid": grid}


register(
    Method(
        "ridge_identity",
        title="Ridge toward the identity",
        docs="ridge-to-identity.md",
        label=lambda job: fitted_on("ReplaceMe LS ridge-to-I", job),
        estimators=(RidgeToIdentityEstimator,),
        presets=("ls_ridge_identity", "replaceme_recipe"),
        check=folds_hold_sequences,
        setting_columns={
            "ridge_criterion": "`objective=ls_ridge_identity`: how the strength of the ridge toward I is chosen: "
            "`sequence_folds` (held-out folds of whole sequences) or `gcv` (generalised cross-validation over tokens); "
            "None for other objectives.",
            "ridge_folds": "`objective=ls_ridge_identity`: folds of whole calibration sequences (sequence j in "
            "fold j mod folds); None for other objectives.",
            "ridge_grid": "`objective=ls_ridge_identity`: JSON `[min, max, points]`, the log-spaced strengths tried, "
            "relative to the mean eigenvalue `trace(M^T M) / d` (0 = plain LS and inf = identity are tried too).",
        },
        settings_of=strength_choice,
        column_docs={
            "ridge_lambda": "`objective=ls_ridge_identity`, per cut: the chosen strength `lam` of `lam ||T - I||^2`, "
            "added to the statistics of all tokens (0: plain LS; None: the identity won).",
            "ridge_lambda_relative": "Per cut: the chosen strength over the mean eigenvalue `trace(M^T M) / d` "
            "(None: the identity won).",
            "ridge_identity_fallback": "Per cut: true when plain removal (T = I, nothing fused) had the least held-out "
            "residual.",
            "ridge_heldout_residual": "Per cut: the mean squared held-out calibration residual per token of the chosen "
            "strength (each fold's T fitted on the other folds).",
            "ridge_heldout_residual_ls": "Per cut: the same of plain LS (`lam = 0`; None where a fold's system is "
            "singular).",
            "ridge_heldout_residual_identity": "Per cut: the same of T = I (plain removal).",
            "ridge_gcv_lambda_relative": "Per cut: the relative strength generalised cross-validation over tokens "
            "picks "
            "(None: the identity).",
            "ridge_gcv_agrees": "Per cut: whether GCV over tokens picks the same strength as the held-out sequences.",
        },
    )
)
