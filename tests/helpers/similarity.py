"""What the unit and integration tests of similarity share: fixtures, builders and constants."""

from __future__ import annotations

import numpy as np
import torch


def brute_force_pwcca(x: torch.Tensor, y: torch.Tensor) -> float:
    """PWCCA on explicit activations (n, d) as google/svcca's pwcca.py computes it, with the paper's
    canonical variates: orthonormal bases of the centred representations (QR), the SVD of
    ``Qx^T Qy`` (correlations and X's variates ``Qx U``), the variates made orthonormal by QR (as
    the reference does), ``alpha_i = sum_j |<h_i, x_j>|`` over X's raw coordinates."""
    x, y = x.double().numpy(), y.double().numpy()
    qx, _ = np.linalg.qr(x - x.mean(0))
    qy, _ = np.linalg.qr(y - y.mean(0))
    u, rho, _ = np.linalg.svd(qx.T @ qy)
    variates, _ = np.linalg.qr(qx @ u)
    alpha = np.abs(variates.T @ x).sum(1)
    return float((alpha / alpha.sum() * rho).sum())


TINY = [
    "model=tiny_llama",
    "calibration.n_samples=16",
    "calibration.seq_len=32",
    "eval.seq_len=32",
    "eval.max_windows=4",
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
    "eval=heldout",  # held-out perplexity only (eval=quick would add lm-eval's offline tasks)
    "save_model=false",
    "n_prune=2",
]
