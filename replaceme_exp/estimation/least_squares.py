"""Closed-form least squares (ridge) from streamed statistics."""

from __future__ import annotations

import torch

from replaceme_exp.capture.statistics import LinearStats
from replaceme_exp.errors import ConfigError
from replaceme_exp.selection.metrics import SelectionMetric, register

# Above this (a lower bound from the Cholesky factor) float64 leaves fewer than ~3 correct digits.
MAX_CONDITION = 1e13


def ridge_solve(stats: LinearStats, alpha: float = 0.0, max_condition: float = MAX_CONDITION) -> torch.Tensor:
    """Solve ``(M^T M + alpha I) T = M^T (L - Y)`` in float64 by Cholesky (no explicit inverse).

    Returns T, (hidden, hidden) float64, such that ``M T`` approximates ``L_{end-1} - Y_{start-1}``.
    Raises ConfigError for too few tokens, a singular or an ill-conditioned system.
    """
    d = stats.mtm.shape[0]
    if alpha < 0:
        raise ConfigError("alpha", alpha, "must be >= 0")
    if alpha == 0 and stats.n_tokens < d:
        raise ConfigError(
            "calibration",
            f"{stats.n_tokens} non-padding tokens",
            f"cut {list(stats.cut)}: too few to determine a {d}x{d} transform; at least {d} are needed "
            "(raise calibration.n_samples or calibration.seq_len), or set alpha>0 (ridge)",
        )
    a = stats.mtm.to(torch.float64)
    if alpha:
        a = a + alpha * torch.eye(d, dtype=a.dtype, device=a.device)
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) != 0:
        raise ConfigError(
            "alpha", alpha, f"cut {list(stats.cut)}: M^T M + alpha I is singular; set alpha>0 (ridge), e.g. alpha=1e-3"
        )
    diag = factor.diagonal()
    condition = float((diag.max() / diag.min()) ** 2)
    if not condition < max_condition:
        raise ConfigError(
            "alpha",
            alpha,
            f"cut {list(stats.cut)}: M^T M + alpha I is ill-conditioned (condition >= {condition:.2e}); "
            "set a larger alpha (ridge)",
        )
    return torch.cholesky_solve(stats.mtr.to(torch.float64), factor)


def ridge_to_identity_solve(stats: LinearStats, lam: float, max_condition: float = MAX_CONDITION) -> torch.Tensor:
    """``T(lam) = argmin ||M T - R||^2 + lam ||T - I||^2 = (M^T M + lam I)^{-1} (M^T R + lam I)``, by
    :func:`ridge_solve` on the statistics with ``lam I`` added to ``M^T R``. ``lam = 0`` is plain LS;
    as ``lam`` grows T goes to I (plain removal). Returns (hidden, hidden) float64."""
    eye = torch.eye(stats.mtr.shape[0], dtype=torch.float64, device=stats.mtr.device)
    shifted = stats.mtr.to(torch.float64) + lam * eye
    target = LinearStats(stats.cut, stats.mtm, shifted, stats.r_sq, stats.n_tokens)
    return ridge_solve(target, alpha=lam, max_condition=max_condition)


def diagonal_solve(stats: LinearStats, alpha: float = 0.0) -> torch.Tensor:
    """The best diagonal T: ``((M^T M) o I + alpha I)^{-1} ((M^T (L - Y)) o I)`` (Hadamard
    products with I), i.e. one scalar per hidden coordinate, ``t_i = (M^T R)_ii / ((M^T M)_ii + alpha)``.
    Returns T, (hidden, hidden) float64 and diagonal."""
    denominator = stats.mtm.diagonal() + alpha
    if not bool((denominator > 0).all()):
        dead = int((denominator <= 0).sum())
        raise ConfigError("alpha", alpha, f"cut {list(stats.cut)}: {dead} coordinates of M are always 0; set alpha>0")
    return torch.diag(stats.mtr.diagonal() / denominator)


def orthonormal_solve(stats: LinearStats) -> torch.Tensor:
    """The best orthonormal T (orthogonal Procrustes): with ``M^T (L - Y) = U S V^T``, ``T = U V^T``.
    ``alpha`` has no role: every orthonormal T has the same norm. Returns (hidden, hidden) float64."""
    u, _, vh = torch.linalg.svd(stats.mtr.to(torch.float64))
    return u @ vh


def residual_sq(stats: LinearStats, transform: torch.Tensor) -> float:
    """``||M T - R||_F^2`` from the statistics alone: ``||R||^2 - 2 tr(T^T M^T R) + tr(T^T M^T M T)``."""
    t = transform.to(torch.float64)
    return float(stats.r_sq - 2 * (t * stats.mtr).sum() + (t * (stats.mtm @ t)).sum())


def ls_residuals(stats: dict, alpha: float = 0.0) -> dict:
    """Mean squared residual per token, ``||M T* - R||_F^2 / n_tokens``, of the (ridge) LS
    transform of every cut: the ``ls_residual`` selection criterion. A cut whose system cannot be
    solved gets ``inf``; if none can, the first error is raised."""
    out, first_error = {}, None
    for cut, s in stats.items():
        try:
            out[cut] = residual_sq(s, ridge_solve(s, alpha)) / s.n_tokens
        except ConfigError as err:
            first_error = first_error or err
            out[cut] = float("inf")
    if first_error is not None and all(v == float("inf") for v in out.values()):
        raise first_error
    return out


# Selection by the residual a cut's own transform leaves (``selection=ls_residual``).
register(SelectionMetric("ls_residual", "statistics", from_statistics=ls_residuals))
