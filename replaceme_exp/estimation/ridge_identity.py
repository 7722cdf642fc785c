"""A ridge toward the identity whose strength the calibration data choose (``objective=ls_ridge_identity``).

``T(lam) = argmin_T ||M T - R||^2 + lam ||T - I||^2 = (M^T M + lam I)^{-1} (M^T R + lam I)``: ``lam = 0``
is ReplaceMe's closed-form LS, ``lam -> inf`` is ``T = I`` (the blocks removed, nothing fused). With
``D = T - I`` and ``R' = R - M`` it is an ordinary ridge ``min ||M D - R'||^2 + lam ||D||^2``, whose
solution for every ``lam`` follows from one eigendecomposition ``M^T M = V diag(s) V^T``:
``D(lam) = V diag(w) B`` with ``w_i = 1 / (s_i + lam)`` and ``B = V^T M^T R'``.

The strength is chosen on held-out calibration sequences: the statistics are kept per fold of whole
sequences (:mod:`replaceme_exp.capture.folds`); for each fold, T is fitted on the other folds and its
residual on the fold is read from the fold's d x d statistics; the candidate with the least total
held-out residual wins (ties go to the larger ``lam``), and T is fitted again on all tokens with it.
Candidates: ``0`` (plain LS, when every fold's system is well conditioned), ``grid_points``
log-spaced strengths from ``grid_min`` to ``grid_max`` times the mean eigenvalue ``trace(M^T M) / d``
of the statistics the fit is taken on, and ``inf`` (the identity). Generalised cross-validation over
tokens (:func:`gcv_scores`) is computed beside it for the row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replaceme_exp.capture.folds import FoldedStats
from replaceme_exp.capture.statistics import Cut, LinearStats
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import Estimator, Requirements
from replaceme_exp.estimation.least_squares import MAX_CONDITION, ridge_solve, ridge_to_identity_solve

CRITERIA = ("sequence_folds", "gcv")


def relative_grid(grid_min: float, grid_max: float, grid_points: int) -> list[float]:
    """The candidate strengths relative to the mean eigenvalue: 0, the log-spaced grid, inf."""
    if grid_points == 1:
        return [0.0, float(grid_min), math.inf]
    step = (math.log10(grid_max) - math.log10(grid_min)) / (grid_points - 1)
    return [0.0] + [10 ** (math.log10(grid_min) + i * step) for i in range(grid_points)] + [math.inf]


def mean_eigenvalue(stats: LinearStats) -> float:
    """``trace(M^T M) / d``."""
    return float(stats.mtm.diagonal().double().mean())


def identity_residual(stats: LinearStats) -> float:
    """``||M - R||_F^2 = ||R||^2 - 2 tr(M^T R) + tr(M^T M)``: the residual of T = I."""
    return float(stats.r_sq - 2 * stats.mtr.diagonal().double().sum() + stats.mtm.diagonal().double().sum())


def _weights(s: torch.Tensor, lam: float) -> torch.Tensor | None:
    """``1 / (s_i + lam)``; zeros for ``lam = inf``; None for ``lam = 0`` on an ill-conditioned ``s``."""
    if math.isinf(lam):
        return torch.zeros_like(s)
    if lam == 0 and not (s.min() > 0 and s.max() / s.min() < MAX_CONDITION):
        return None
    return 1.0 / (s + lam)


def heldout_residuals(folds: tuple[LinearStats, ...], grid: list[float]) -> list[float | None]:
    """For each relative strength of ``grid``, the summed residual ``||M_f T_{-f} - R_f||^2`` over the
    folds ``f``, where ``T_{-f}`` is :func:`~replaceme_exp.estimation.least_squares.ridge_to_identity_solve`
    on the other folds with ``lam = grid value x`` their mean eigenvalue. From d x d statistics only:
    with the fit's ``M^T M = V diag(s) V^T``, ``B = V^T (M^T R - M^T M)`` of the fit, the held-out
    fold's ``G = V^T M_f^T M_f V`` and ``P = V^T (M_f^T R_f - M_f^T M_f)``, the residual is
    ``||R_f - M_f||^2 - 2 w.p + w^T Q w`` with ``p_i = sum_j B_ij P_ij`` and ``Q = G o (B B^T)``.
    None where a strength cannot be fitted on some fold (``0`` on a singular system)."""
    total = FoldedStats.of(list(folds))
    out: list[float | None] = [0.0] * len(grid)
    for held in folds:
        fit_mtm = total.mtm.double() - held.mtm.double()
        fit_mtr = total.mtr.double() - held.mtr.double()
        s, v = torch.linalg.eigh(fit_mtm)
        s = s.clamp_min(0.0)  # the Gram matrix is PSD; eigh may return -eps
        b = v.T @ (fit_mtr - fit_mtm)
        g = v.T @ held.mtm.double() @ v
        p = (b * (v.T @ (held.mtr.double() - held.mtm.double()))).sum(1)
        q = g * (b @ b.T)
        base = identity_residual(held)
        scale = float(fit_mtm.diagonal().mean())
        for i, relative in enumerate(grid):
            w = _weights(s, relative * scale)
            if w is None or out[i] is None:
                out[i] = None
                continue
            out[i] += base - 2 * float(w @ p) + float(w @ q @ w)
    return out


def gcv_scores(stats: LinearStats, grid: list[float]) -> list[float | None]:
    """Generalised cross-validation over tokens for each relative strength of ``grid``:
    ``(RSS / (n d)) / (1 - df / n)^2`` with ``RSS = ||R'||^2 - sum_i b_i (2 w_i - s_i w_i^2)``
    (``b_i`` the squared norm of row i of ``B``), ``df = sum_i s_i w_i`` and ``n`` the tokens. It
    treats tokens as independent; None where it cannot be taken (``df >= n``, a singular ``lam = 0``)."""
    s, v = torch.linalg.eigh(stats.mtm.double())
    s = s.clamp_min(0.0)
    b = (v.T @ (stats.mtr.double() - stats.mtm.double())).pow(2).sum(1)
    base, n, d = identity_residual(stats), stats.n_tokens, s.numel()
    scale = mean_eigenvalue(stats)
    out: list[float | None] = []
    for relative in grid:
        w = _weights(s, relative * scale)
        if w is None:
            out.append(None)
            continue
        rss = base - float((b * (2 * w - s * w * w)).sum())
        df = float((s * w).sum())
        out.append(rss / (n * d) / (1 - df / n) ** 2 if df < n else None)
    return out


def best(grid: list[float], scores: list[float | None]) -> float:
    """The strength of least score; a tie goes to the larger strength (toward the identity)."""
    chosen, least = None, math.inf
    for relative, score in reversed(list(zip(grid, scores))):
        if score is not None and score < least:
            chosen, least = relative, score
    if chosen is None:
        raise ConfigError("objective", "ls_ridge_identity", "no candidate strength could be evaluated")
    return chosen


@dataclass(frozen=True)
class RidgeChoice:
    """What the choice of one cut's strength found. ``relative``: the chosen strength over the mean
    eigenvalue (0: plain LS; inf: the identity); ``absolute``: the strength added to the statistics
    of all tokens; ``heldout_*``: mean held-out residual per token (summed over folds, over their
    tokens) of the chosen strength, of plain LS (None when singular on a fold) and of T = I;
    ``gcv_relative``: what generalised cross-validation over tokens picks on all tokens."""

    relative: float
    absolute: float
    heldout: float
    heldout_ls: float | None
    heldout_identity: float
    gcv_relative: float

    @property
    def identity(self) -> bool:
        return math.isinf(self.relative)


def choose(stats: FoldedStats, grid: list[float], criterion: str = "sequence_folds") -> RidgeChoice:
    """The strength of one cut by ``criterion`` (held-out folds, or GCV over tokens), with the
    held-out residuals of the chosen strength, plain LS and the identity."""
    if len(stats.folds) < 2:
        raise ConfigError("objective.folds", len(stats.folds), "choosing a strength needs folds of the statistics")
    held = heldout_residuals(stats.folds, grid)
    gcv = gcv_scores(stats, grid)
    by_folds, by_gcv = best(grid, held), best(grid, gcv)
    relative = by_folds if criterion == "sequence_folds" else by_gcv
    n = stats.n_tokens
    return RidgeChoice(
        relative=relative,
        absolute=relative * mean_eigenvalue(stats),
        heldout=held[grid.index(relative)] / n,
        heldout_ls=None if held[0] is None else held[0] / n,
        heldout_identity=held[-1] / n,
        gcv_relative=by_gcv,
    )


class RidgeToIdentityEstimator(Estimator):
    """The closed-form LS transform shrunk toward the identity by a strength chosen from the
    calibration data (module docstring); ``None`` (the blocks removed, nothing fused) when the
    identity wins. ``alpha`` does not act: the strength is chosen, and recorded per cut."""

    name = "ls_ridge_identity"

    def __init__(
        self,
        name: str = "ls_ridge_identity",
        max_condition: float = MAX_CONDITION,
        folds: int = 5,
        criterion: str = "sequence_folds",
        grid_min: float = 1e-6,
        grid_max: float = 1e3,
        grid_points: int = 19,
    ):
        if criterion not in CRITERIA:
            raise ConfigError("objective.criterion", criterion, f"choose one of {CRITERIA}")
        self.name, self.max_condition, self.folds, self.criterion = name, max_condition, folds, criterion
        self.grid = relative_grid(grid_min, grid_max, grid_points)
        self.choices: dict[Cut, RidgeChoice] = {}

    @classmethod
    def requirements(cls, objective) -> Requirements:
        return Requirements(
            statistics=True,
            uses_alpha=False,
            alpha_scale=None,
            regularizers=("none",),
            structures=("generic",),
            statistic_folds=int(objective.folds),
        )

    def estimate(self, stats: LinearStats | None, alpha: float, structure: str = "generic") -> torch.Tensor | None:
        if structure != "generic":
            raise ConfigError("structure", structure, f"objective={self.name} supports generic")
        if not isinstance(stats, FoldedStats):
            raise ConfigError("objective", self.name, f"cut {list(stats.cut)}: needs the statistics per fold")
        choice = choose(stats, self.grid, self.criterion)
        self.choices[stats.cut] = choice
        if choice.identity:
            return None
        if choice.relative == 0:
            return ridge_solve(stats, 0.0, self.max_condition)
        return ridge_to_identity_solve(stats, choice.absolute, self.max_condition)

    def columns(self) -> dict[str, dict[Cut, object]]:
        """Per cut: the chosen strength (absolute, relative; None at the identity), whether it fell
        back to the identity, the held-out residuals and GCV's pick."""
        finite = lambda x: None if math.isinf(x) else x  # noqa: E731
        c = self.choices
        return {
            "ridge_lambda": {cut: finite(x.absolute) for cut, x in c.items()},
            "ridge_lambda_relative": {cut: finite(x.relative) for cut, x in c.items()},
            "ridge_identity_fallback": {cut: x.identity for cut, x in c.items()},
            "ridge_heldout_residual": {cut: x.heldout for cut, x in c.items()},
            "ridge_heldout_residual_ls": {cut: x.heldout_ls for cut, x in c.items()},
            "ridge_heldout_residual_identity": {cut: x.heldout_identity for cut, x in c.items()},
            "ridge_gcv_lambda_relative": {cut: finite(x.gcv_relative) for cut, x in c.items()},
            "ridge_gcv_agrees": {cut: x.gcv_relative == x.relative for cut, x in c.items()},
        }
