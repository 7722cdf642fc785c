"""Numerical estimation of T from per-token activations in a :class:`TokenStore`.

Objectives (per non-padding token, averaged over a batch):
- ``cosine``: 1 - cos(M T, R), the paper's memory-saving form (stores M and R = L - Y);
- ``cosine_exact``: 1 - cos(M T + Y, L) with L = R + Y (stores M, R and Y);
- ``mse``: ||M T - R||^2, the least-squares objective solved numerically.
Regularisers: ``l1`` (alpha * sum |T|), ``l2`` (alpha * ||T||_F^2). Structures: ``generic`` (full T)
and ``diagonal`` (T = diag(t)).

Solvers: ``adam`` (mini-batches, the paper's recipe); full-batch ``lbfgs`` (PyTorch's
``torch.optim.LBFGS`` with a strong-Wolfe line search), ``nlcg`` (SciPy's nonlinear conjugate
gradient, ``method="CG"``) and ``trust_ncg`` (SciPy's trust-region Newton-CG). The full-batch
solvers see the exact objective over all stored tokens, evaluated in chunks of ``chunk_tokens``:
gradients and Hessian-vector products are summed chunk by chunk in PyTorch, on the store's
device, so memory stays at one chunk of activations whatever the number of tokens.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F

from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import Estimator

log = logging.getLogger(__name__)

LOSSES = ("cosine", "cosine_exact", "mse")
SOLVERS = ("adam", "lbfgs", "nlcg", "trust_ncg")


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
        max_iter: int = 100,
        chunk_tokens: int = 8192,
    ):
        if loss not in LOSSES:
            raise ConfigError("objective.loss", loss, f"choose one of {LOSSES}")
        if solver not in SOLVERS:
            raise ConfigError("objective.solver", solver, f"choose one of {SOLVERS}")
        if init not in ("identity", "ls"):
            raise ConfigError("objective.init", init, "choose identity or ls")
        self.name, self.loss, self.solver = name, loss, solver
        self.lr, self.batch_tokens, self.epochs, self.init = lr, batch_tokens, epochs, init
        self.max_iter, self.chunk_tokens = max_iter, chunk_tokens
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
        mask_ratio: float = 0.0,
    ) -> tuple[torch.Tensor, dict]:
        """Returns T, (hidden, hidden) float64, and ``{"loss_curve": [loss at the start, then
        the mean loss of each Adam epoch or the objective after each full-batch iteration],
        "final_loss": its last entry}``.

        ``mask_ratio``: each Adam step leaves out that fraction of its batch's tokens, drawn from
        a generator seeded by ``seed`` (the paper's token-masking augmentation for small data)."""
        if not 0.0 <= mask_ratio < 1.0:
            raise ConfigError("mask_ratio", mask_ratio, "must be in [0, 1)")
        if mask_ratio and self.solver != "adam":
            raise ConfigError(
                "mask_ratio", mask_ratio, f"token masking needs mini-batches (solver=adam), not {self.solver}"
            )
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
        if self.solver == "adam":
            curve = self._adam(store, param, as_matrix, alpha, regularizer, seed, mask_ratio)
        else:
            objective = ChunkedObjective(store, self.loss, as_matrix, regularizer, alpha, self.chunk_tokens)
            curve = self._full_batch(objective, param)
        if not all(torch.isfinite(torch.tensor(curve))):
            raise ConfigError("objective.lr", self.lr, "the loss became NaN or inf; lower the learning rate")
        log.info("%s/%s: loss %.5f -> %.5f in %d steps", self.name, self.solver, curve[0], curve[-1], len(curve) - 1)
        log.info("loss curve: %s", " ".join(f"{v:.5f}" for v in curve))
        return as_matrix(param.detach()).double().cpu(), {"loss_curve": curve, "final_loss": curve[-1]}

    def _adam(self, store, param, as_matrix, alpha, regularizer, seed, mask_ratio=0.0) -> list[float]:
        """Mini-batches of ``batch_tokens`` drawn by a seeded permutation (rows are gathered from
        the store; nothing is copied per epoch). Returns the mean loss of each epoch, preceded by
        the loss at the start (the first batch)."""
        optimiser = torch.optim.Adam([param], lr=self.lr)
        generator = torch.Generator().manual_seed(seed)
        curve: list[float] = []
        for _ in range(self.epochs):
            order = torch.randperm(store.n_tokens, generator=generator)
            total, batches = 0.0, 0
            for i in range(0, store.n_tokens, self.batch_tokens):
                indices = order[i : i + self.batch_tokens]
                if mask_ratio:
                    kept = indices[torch.rand(indices.numel(), generator=generator) >= mask_ratio]
                    indices = kept if kept.numel() else indices[:1]
                rows = store.rows(indices)
                loss = batch_loss(self.loss, rows["M"] @ as_matrix(param), rows) + penalty(regularizer, alpha, param)
                if not curve:
                    curve.append(loss.detach().item())
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                total, batches = total + loss.detach().item(), batches + 1
            curve.append(total / batches)
        return curve

    def _full_batch(self, objective: "ChunkedObjective", param: torch.nn.Parameter) -> list[float]:
        """Full-batch solvers; returns the objective at the start and after every iteration."""
        curve = [objective.value_and_grad(param.detach())[0]]
        if self.solver == "lbfgs":
            optimiser = torch.optim.LBFGS(
                [param],
                lr=1.0,
                max_iter=self.max_iter,
                history_size=20,
                line_search_fn="strong_wolfe",
                tolerance_grad=1e-9,
                tolerance_change=1e-12,
            )

            def closure():
                value, grad = objective.value_and_grad(param.detach())
                param.grad = grad
                curve.append(value)
                return torch.tensor(value)

            optimiser.step(closure)
            return curve
        from scipy.optimize import minimize

        shape, device = param.shape, param.device

        def to_torch(x):
            return torch.from_numpy(x).to(device=device, dtype=torch.float32).view(shape)

        def fun(x):
            value, grad = objective.value_and_grad(to_torch(x))
            return value, grad.double().cpu().numpy().ravel()

        def hessp(x, v):
            return objective.hvp(to_torch(x), to_torch(v)).double().cpu().numpy().ravel()

        x0 = param.detach().double().cpu().numpy().ravel()
        callback = lambda x: curve.append(objective.value_and_grad(to_torch(x))[0])  # noqa: E731
        if self.solver == "nlcg":
            result = minimize(fun, x0, jac=True, method="CG", callback=callback, options={"maxiter": self.max_iter})
        else:
            result = minimize(
                fun,
                x0,
                jac=True,
                hessp=hessp,
                method="trust-ncg",
                callback=callback,
                options={"maxiter": self.max_iter, "gtol": 1e-8},
            )
        with torch.no_grad():
            param.copy_(to_torch(np.asarray(result.x)))
        return curve


class ChunkedObjective:
    """The exact full-batch objective (mean loss over all stored tokens + penalty), its gradient
    and Hessian-vector products, computed chunk by chunk so that memory does not grow with the
    number of tokens."""

    def __init__(self, store, loss: str, as_matrix, regularizer: str, alpha: float, chunk_tokens: int):
        self.store, self.loss, self.as_matrix = store, loss, as_matrix
        self.regularizer, self.alpha, self.chunk_tokens = regularizer, alpha, chunk_tokens

    def _chunks(self):
        n = self.store.n_tokens
        for i in range(0, n, self.chunk_tokens):
            idx = torch.arange(i, min(i + self.chunk_tokens, n))
            yield self.store.rows(idx), idx.numel() / n

    def _chunk_value(self, p: torch.Tensor, rows, weight: float) -> torch.Tensor:
        return weight * batch_loss(self.loss, rows["M"] @ self.as_matrix(p), rows)

    def value_and_grad(self, param: torch.Tensor) -> tuple[float, torch.Tensor]:
        p = param.detach().clone().requires_grad_(True)
        total, grad = 0.0, torch.zeros_like(p)
        for rows, weight in self._chunks():
            value = self._chunk_value(p, rows, weight)
            grad += torch.autograd.grad(value, p)[0]
            total += value.item()
        reg = penalty(self.regularizer, self.alpha, p)
        if reg.requires_grad:
            grad += torch.autograd.grad(reg, p)[0]
        return total + reg.item(), grad

    def hvp(self, param: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        p = param.detach().clone().requires_grad_(True)
        out = torch.zeros_like(p)
        for rows, weight in self._chunks():
            (g,) = torch.autograd.grad(self._chunk_value(p, rows, weight), p, create_graph=True)
            out += torch.autograd.grad((g * vector).sum(), p)[0]
        if self.regularizer == "l2" and self.alpha:
            out += 2 * self.alpha * vector
        return out
