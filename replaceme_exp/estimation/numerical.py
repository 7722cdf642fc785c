"""Numerical estimation of T from per-token activations in a :class:`TokenStore`.

Objectives (per non-padding token, averaged over a batch):
- ``cosine``: 1 - cos(M T, R), the paper's memory-saving form (stores M and R = L - Y);
- ``cosine_exact``: 1 - cos(M T + Y, L) with L = R + Y (stores M, R and Y);
- ``mse``: ||M T - R||^2, the least-squares objective solved numerically.
Regularisers: ``l1`` (alpha * sum |T|), ``l2`` (alpha * ||T||_F^2). Structures: ``generic`` (full T)
and ``diagonal`` (T = diag(t)).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import Estimator

log = logging.getLogger(__name__)

LOSSES = ("cosine", "cosine_exact", "mse")
SOLVERS = ("adam",)


def batch_loss(loss: str, mt: torch.Tensor, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean loss over a batch; ``mt`` = M T (batch, hidden), ``rows`` from the store."""
    if loss == "cosine":
        return (1 - F.cosine_similarity(mt, rows["R"], dim=-1, eps=1e-8)).mean()
    if loss == "cosine_exact":
        y = rows["Y"]
        return (1 - F.cosine_similarity(mt + y, rows["R"] + y, dim=-1, eps=1e-8)).mean()
    if loss == "mse":
        return (mt - rows["R"]).pow(2).sum(-1).mean()
    raise ConfigError("objective.loss", loss, f"choose one of {LOSSES}")


def penalty(regularizer: str, alpha: float, t: torch.Tensor) -> torch.Tensor:
    if regularizer == "l1" and alpha:
        return alpha * t.abs().sum()
    if regularizer == "l2" and alpha:
        return alpha * t.pow(2).sum()
    return t.new_zeros(())


class NumericalEstimator(Estimator):
    """Minimises ``loss`` over T with ``solver`` on the stored tokens (paper recipe: Adam, lr 1e-4,
    batches of 1024 tokens, 10 epochs, T initialised to the identity; ``init=ls`` starts from the
    closed-form solution instead)."""

    needs_tokens = True

    def __init__(
        self,
        name: str,
        loss: str,
        solver: str = "adam",
        lr: float = 1e-4,
        batch_tokens: int = 1024,
        epochs: int = 10,
        init: str = "identity",
    ):
        if loss not in LOSSES:
            raise ConfigError("objective.loss", loss, f"choose one of {LOSSES}")
        if solver not in SOLVERS:
            raise ConfigError("objective.solver", solver, f"choose one of {SOLVERS}")
        if init not in ("identity", "ls"):
            raise ConfigError("objective.init", init, "choose identity or ls")
        self.name, self.loss, self.solver = name, loss, solver
        self.lr, self.batch_tokens, self.epochs, self.init = lr, batch_tokens, epochs, init
        self.needs_statistics = init == "ls"
        self.loss_curve: list[float] = []

    def store_names(self) -> tuple[str, ...]:
        return ("M", "R", "Y") if self.loss == "cosine_exact" else ("M", "R")

    def fit(
        self,
        store,
        alpha: float,
        regularizer: str,
        structure: str,
        seed: int,
        init_transform: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """Returns T, (hidden, hidden) float64, and ``{"loss_curve": per-epoch mean loss,
        "final_loss": the last epoch's mean loss}``."""
        if structure not in ("generic", "diagonal"):
            raise ConfigError("structure", structure, f"objective={self.name} supports generic or diagonal")
        device, d = store.compute_device, store.hidden
        start = torch.eye(d, dtype=torch.float64) if init_transform is None else init_transform.cpu()
        if structure == "diagonal":
            param = torch.nn.Parameter(start.diagonal().to(device, torch.float32).clone())
            as_matrix = torch.diag
        else:
            param = torch.nn.Parameter(start.to(device, torch.float32).clone())
            as_matrix = lambda p: p  # noqa: E731
        optimiser = torch.optim.Adam([param], lr=self.lr)
        generator = torch.Generator().manual_seed(seed)
        curve = []
        for _ in range(self.epochs):
            order = torch.randperm(store.n_tokens, generator=generator)
            total, batches = 0.0, 0
            for i in range(0, store.n_tokens, self.batch_tokens):
                rows = store.rows(order[i : i + self.batch_tokens])
                t = as_matrix(param)
                loss = batch_loss(self.loss, rows["M"] @ t, rows) + penalty(regularizer, alpha, param)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                total, batches = total + loss.detach().item(), batches + 1
            curve.append(total / batches)
        if not all(torch.isfinite(torch.tensor(curve))):
            raise ConfigError("objective.lr", self.lr, "the loss became NaN or inf; lower the learning rate")
        log.info("%s/%s: loss %.5f -> %.5f over %d epochs", self.name, self.solver, curve[0], curve[-1], self.epochs)
        return as_matrix(param.detach()).double().cpu(), {"loss_curve": curve, "final_loss": curve[-1]}
