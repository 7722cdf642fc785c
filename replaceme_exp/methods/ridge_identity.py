"""Closed-form LS with a ridge toward the identity whose strength the calibration data choose
(``objective=ls_ridge_identity``; this project's, beyond the paper): docs/methods/ridge-to-identity.md."""

from replaceme_exp.estimation.ridge_identity import RidgeToIdentityEstimator
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.methods.replaceme_ls import fitted_on

register(
    Method(
        "ridge_identity",
        docs="ridge-to-identity.md",
        label=lambda job: fitted_on("ReplaceMe LS ridge-to-I", job),
        estimators=(RidgeToIdentityEstimator,),
        presets=("ls_ridge_identity",),
    )
)
