"""Numerical estimation of T from per-token activations in a :class:`TokenStore`.

Objectives (per non-padding token, averaged over a batch):
- ``cosine``: 1 - cos(M T, R), the paper's memory-saving form (stores M and R = L - Y);
- ``cosine_exact``: 1 - cos(M T + Y, L) with L = R + Y (stores M, R and Y): the official code's
  ``accurate=True`` (prediction ``X A + Z`` against L); ``mse_exact`` and ``elasticnet_exact`` are
  the same form of the next two (:data:`EXACT_LOSSES`);
- ``mse``: ||M T - R||^2, the least-squares objective solved numerically; ``mse_reduction="mean"``:
  its mean over hidden, the official ``nn.MSELoss(reduction="mean")`` (d times smaller);
- ``elasticnet``: the official code's ``loss="elasticnet"``, on a batch of n tokens
  ``mean((M T - R)^2) + 0.09 * sum|M T| + 0.045 * sum (M T)^2``: the mean over the batch's n x d
  entries plus an L1 and a squared L2 norm of the prediction M T SUMMED over the batch (its
  ``torch.norm`` of the whole matrix), with these fixed weights. The penalties' weight next to the
  mean squared error grows with n: kept as in the official code (batches of ``batch_tokens``, the
  last one smaller; ``full_batch``: all stored tokens as one batch).
Regularisers: ``l1`` (sum |T|), ``l2`` (||T||_F^2), and ``l1_to_identity`` / ``l2_to_identity``
(the same on T - I), weighted by ``alpha`` on a scale set by the objective (``alpha_scale``):
- ``token_mean`` (cosine, cosine_exact): mean loss per token + alpha * penalty, the scale of the
  paper's cosine alphas (1e-4 for L1, 1e-2 for L2);
- ``token_sum`` (mse): sum over tokens of the loss + alpha * penalty, the convention of
  ``objective=ls`` (ridge: ``(M^T M + alpha I)^{-1} M^T R``), so that ``objective=mse regularizer=l2
  alpha=a`` has the minimiser of ``objective=ls alpha=a``. It is computed as the mean loss +
  (alpha / N) * penalty with N the number of stored tokens (same minimiser; ``mse_reduction="mean"``:
  + (alpha / (N d)) * penalty, the same objective over N d); a mini-batch uses its own mean loss +
  that penalty, an unbiased estimate of that objective.
Structures (:data:`STRUCTURES`): ``generic`` (full T), ``diagonal`` (T = diag(t)), and the official
code's other two Adam-path structures: ``rank1`` (its ``two_vectors``: T = t1 t2^T, t1 and t2 in
R^{d x 1}, started at t1 = t2 = 1, i.e. T = the all-ones matrix; ``init=ls`` starts from the best
rank-1 approximation of the LS solution) and ``lower_triangular`` (its ``thri``: a
``LowerTriangularLinear`` whose forward pass is ``x @ tril(W)^T``, so T = tril(W)^T, upper
triangular in this project's X T convention: output coordinate j depends on input coordinates
i <= j; started at T = I). A penalty (``regularizer``) acts on T itself for every structure.

``cosine`` is invariant to T's scale (cos(M cT, R) = cos(M T, R) for c > 0), so ``l1`` / ``l2`` on T
(the paper's text: L1 1e-4, L2 1e-2 with the cosine objective) have no minimiser: the penalty only
shrinks T, by an amount set by the learning rate and the number of steps rather than by alpha,
while the fused model computes ``Y + M T``, where the scale matters. Kept for the paper's table,
with a warning in the row (:func:`regularizer_warning`). Well-posed: the penalty on ``T - I``
(``*_to_identity``: the scale settles where the penalty is smallest), or the penalty with
``cosine_exact`` (1 - cos(M T + Y, L) depends on T's scale).

Solvers: ``adam`` (mini-batches, the paper's recipe), ``lbfgs`` (PyTorch's ``torch.optim.LBFGS``
with a strong-Wolfe line search), ``nlcg`` (SciPy's nonlinear conjugate gradient,
``method="CG"``), ``trust_ncg`` (SciPy's trust-region Newton-CG: the paper's table's "Trust-NCG") and
``newton_cg`` (SciPy's line-search Newton-CG, ``method="Newton-CG"``: the "Newton-CG" of the paper's
text), both with exact Hessian-vector products. Schedules for the non-Adam
solvers (``schedule``):
- ``full_batch``: up to ``max_iter`` iterations on the exact objective over all stored tokens,
  evaluated in chunks of ``chunk_tokens``: gradients and Hessian-vector products are summed chunk
  by chunk in PyTorch, on the store's device, so memory stays at one chunk of activations whatever
  the number of tokens;
- ``minibatch`` (the official ReplaceMe code): for ``epochs`` epochs, for each batch of
  ``batch_tokens`` tokens of a seeded shuffle, ONE solver iteration on that batch's objective,
  starting from the current T with fresh solver state (no L-BFGS history, CG direction or trust
  radius carried over from the previous batch).
Adam is mini-batch by nature: both schedules run the same thing.
``solver_backend`` runs the non-Adam solvers: ``scipy_torch`` as above, or ``torchmin`` (the
official code's library, pytorch-minimize): under ``minibatch`` only, each batch's step is its
``minimize(objective, T, method=..., max_iter=1)`` (:data:`TORCHMIN_METHODS`, its defaults
otherwise: L-BFGS and CG with its strong-Wolfe search, Newton-CG whose CG runs up to 20 x the
parameters' count of iterations, trust-ncg from radius 1), on the whole batch at once.
The non-Adam solvers work in ``precision``, float64 by default (T, the activations of each chunk,
values and gradients): their line searches and trust regions decide on differences of objective
values that float32 rounds away, so in float32 (the official code's) their steps depend on the CPU's
vector kernels: the first L-BFGS step of a tiny model's job was 10x its trial length on AVX-512 and
5.5x on AVX2. Adam runs in float32, as in the paper's recipe.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch
import torch.nn.functional as F

from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import Estimator, Requirements
from replaceme_exp.progress import progress_counter

log = logging.getLogger(__name__)

LOSSES = ("cosine", "cosine_exact", "mse", "mse_exact", "elasticnet", "elasticnet_exact")
# The official ``accurate=True`` forms: the prediction M T + Y against L = R + Y (the store keeps Y),
# by the loss they apply.
EXACT_LOSSES = {"cosine_exact": "cosine", "mse_exact": "mse", "elasticnet_exact": "elasticnet"}
# ``mse``'s reduction: ``sum_hidden`` (the sum over hidden, mean over tokens: this project's) or ``mean``
# (over tokens x hidden: the official ``nn.MSELoss(reduction="mean")``, d times smaller).
MSE_REDUCTIONS = ("sum_hidden", "mean")
STRUCTURES = ("generic", "diagonal", "rank1", "lower_triangular")
# The official code's elasticnet weights (ReplaceMe/utils.py, adam_method): of the L1 norm and of the
# squared L2 norm of the prediction M T over a batch.
ELASTICNET_L1, ELASTICNET_L2 = 0.09, 0.045
SOLVERS = ("adam", "lbfgs", "nlcg", "trust_ncg", "newton_cg")
# SciPy's method and options (besides maxiter) of the solvers that ``minimize`` runs.
SCIPY_METHODS = {
    "nlcg": ("CG", {}),
    "newton_cg": ("Newton-CG", {"xtol": 1e-10}),
    "trust_ncg": ("trust-ncg", {"gtol": 1e-8, "initial_trust_radius": 1.0}),
}
# What runs the non-Adam solvers: ``scipy_torch`` (SciPy's minimize, PyTorch's L-BFGS: :data:`SCIPY_METHODS`)
# or ``torchmin`` (the official code's library, pytorch-minimize: its minimize with these methods).
SOLVER_BACKENDS = ("scipy_torch", "torchmin")
TORCHMIN_METHODS = {"lbfgs": "l-bfgs", "nlcg": "cg", "trust_ncg": "trust-ncg", "newton_cg": "newton-cg"}
SCHEDULES = ("full_batch", "minibatch")
PRECISIONS = ("float64", "float32")
# Strong-Wolfe line search of a mini-batch L-BFGS step: at most this many trial points (torchmin's
# default ``max_ls``). torch.optim.LBFGS caps its search at max_eval - 1 evaluations, and its default
# max_eval for max_iter=1 is 1, which would leave a single untested trial step.
MAX_LINE_SEARCH = 25
# How ``alpha`` weighs the penalty against the data term, by loss (see the module docstring).
ALPHA_SCALES = {
    "cosine": "token_mean",
    "cosine_exact": "token_mean",
    "mse": "token_sum",
    "mse_exact": "token_sum",
    "elasticnet": "token_mean",
    "elasticnet_exact": "token_mean",
}
REGULARIZERS = ("none", "l1", "l2", "l1_to_identity", "l2_to_identity")
# Losses whose value does not change with T's scale: a penalty on T itself has no minimiser.
SCALE_FREE_LOSSES = ("cosine",)


def solver_precision(solver: str, precision: str) -> str:
    """The dtype ``solver`` computes T in: float32 for Adam (the paper's recipe), ``precision`` for the
    line-search and trust-region solvers (module docstring)."""
    return "float32" if solver == "adam" else precision


def check_backend(solver: str, schedule: str, backend: str) -> None:
    """Refuse a ``backend`` that cannot run ``solver`` under ``schedule`` (one line, :class:`ConfigError`)."""
    if backend not in SOLVER_BACKENDS:
        raise ConfigError("objective.solver_backend", backend, f"choose one of {SOLVER_BACKENDS}")
    if backend == "torchmin" and solver != "adam" and schedule != "minibatch":
        reason = "runs the official code's one step per batch only (objective.schedule=minibatch)"
        raise ConfigError("objective.solver_backend", backend, reason)


def regularizer_warning(loss: str, regularizer: str, alpha: float) -> str | None:
    """Why ``regularizer`` at ``alpha`` is ill-posed with ``loss`` (None: it is not)."""
    if loss in SCALE_FREE_LOSSES and regularizer in ("l1", "l2") and alpha:
        return (
            f"objective.loss={loss} is invariant to T's scale: regularizer={regularizer} only shrinks T, by an "
            "amount set by lr x steps, not by alpha (well-posed: regularizer="
            f"{regularizer}_to_identity, or objective=cosine_exact)"
        )
    return None


def batch_loss(
    loss: str,
    mt: torch.Tensor,
    rows: dict[str, torch.Tensor],
    set_tokens: int | None = None,
    mse_reduction: str = "sum_hidden",
) -> torch.Tensor:
    """The loss of a batch; ``mt`` = M T (batch, hidden), ``rows`` from the store. The prediction is
    M T against R, or M T + Y against L = R + Y for :data:`EXACT_LOSSES`. A mean over the batch's
    tokens (``mse``: of the squared error summed over hidden, or its mean over hidden with
    ``mse_reduction="mean"``), except for ``elasticnet`` (:func:`elasticnet_loss`). ``set_tokens``:
    the batch is a chunk of a set of this many tokens whose loss is the chunks' values weighted by
    their share of tokens (:class:`ChunkedObjective`); None: the batch is the whole set."""
    if loss not in LOSSES:
        raise ConfigError("objective.loss", loss, f"choose one of {LOSSES}")
    prediction, target = mt, rows["R"]
    if loss in EXACT_LOSSES:
        y = rows["Y"]
        prediction, target = mt + y, target + y
    base = EXACT_LOSSES.get(loss, loss)
    if base == "cosine":
        return (1 - F.cosine_similarity(prediction, target, dim=-1, eps=1e-8)).mean()
    if base == "mse":
        if mse_reduction == "mean":
            return F.mse_loss(prediction, target, reduction="mean")
        return (prediction - target).pow(2).sum(-1).mean()
    return elasticnet_loss(prediction, target, 1.0 if set_tokens is None else set_tokens / mt.shape[0])


def elasticnet_loss(mt: torch.Tensor, r: torch.Tensor, sum_scale: float = 1.0) -> torch.Tensor:
    """The official code's elasticnet loss of a batch, ``mt`` the prediction (M T, or M T + Y) and
    ``r`` its target (R, or L) (batch, hidden): ``mean((mt - r)^2) + 0.09 * ||mt||_1 + 0.045 *
    ||mt||_2^2``, the norms of the whole matrix (sums over the batch). ``sum_scale`` multiplies the
    norms: n_set / n_chunk for a chunk of a set of n_set tokens, so that the chunks' values weighted
    by n_chunk / n_set add up to the set's loss."""
    norms = ELASTICNET_L1 * torch.norm(mt, p=1) + ELASTICNET_L2 * torch.norm(mt, p=2) ** 2
    return F.mse_loss(mt, r, reduction="mean") + (norms if sum_scale == 1.0 else sum_scale * norms)


def penalty(regularizer: str, alpha: float, t: torch.Tensor) -> torch.Tensor:
    """``alpha`` times the penalty of ``t``; ``alpha`` is the weight next to a MEAN per-token loss
    (callers convert: :meth:`NumericalEstimator.penalty_weight`)."""
    if regularizer == "none" or not alpha:
        return t.new_zeros(())
    if regularizer.endswith("_to_identity"):  # t: a matrix, or the diagonal of a diagonal T
        t = t - (torch.eye(t.shape[0], dtype=t.dtype, device=t.device) if t.dim() == 2 else torch.ones_like(t))
    if regularizer.startswith("l1"):
        return alpha * t.abs().sum()
    if regularizer.startswith("l2"):
        return alpha * t.pow(2).sum()
    raise ConfigError("regularizer", regularizer, f"choose one of {REGULARIZERS}")


def batches_per_epoch(n_tokens: int, batch_tokens: int) -> int:
    return -(-n_tokens // batch_tokens)


def shuffled_batches(n_tokens: int, batch_tokens: int, generator: torch.Generator):
    """One epoch: a seeded permutation of the token indices cut into batches of ``batch_tokens``
    (the last one may be smaller)."""
    order = torch.randperm(n_tokens, generator=generator)
    for i in range(0, n_tokens, batch_tokens):
        yield order[i : i + batch_tokens]


def rank1_matrix(p: torch.Tensor) -> torch.Tensor:
    """T = t1 t2^T from ``p`` = [t1 t2] (hidden, 2)."""
    return p[:, :1] @ p[:, 1:].T


def parametrise(structure: str, start: torch.Tensor, device, official_start: bool, dtype=torch.float32):
    """The parameter of T under ``structure`` (``dtype`` on ``device``), started from ``start``
    (hidden, hidden), and two maps of it: to T (hidden, hidden), and to what a penalty acts on
    (the parameter itself for ``generic`` and ``diagonal``; T for ``rank1`` and ``lower_triangular``,
    whose parameter holds entries that T does not use or only their products).

    - ``generic``: T itself; ``diagonal``: its diagonal (hidden,);
    - ``rank1``: [t1 t2] (hidden, 2) with T = t1 t2^T; ``official_start``: t1 = t2 = 1 (the official
      ``two_vectors``), else sqrt(s) u and sqrt(s) v of ``start``'s largest singular triple (its best
      rank-1 approximation);
    - ``lower_triangular``: P (hidden, hidden) with T = triu(P), the official ``thri``'s
      ``tril(W)^T`` with P = W^T (entries below the diagonal get no gradient and stay as started).

    Returns (param, as_matrix, penalised)."""
    start = start.to(torch.float64)
    if structure == "diagonal":
        return torch.nn.Parameter(start.diagonal().to(device, dtype).clone()), torch.diag, None
    if structure == "rank1":
        if official_start:
            vectors = torch.ones(start.shape[0], 2, dtype=torch.float64)
        else:
            u, s, vh = torch.linalg.svd(start)
            vectors = torch.stack([u[:, 0], vh[0]], dim=1) * s[0].sqrt()
        return torch.nn.Parameter(vectors.to(device, dtype)), rank1_matrix, rank1_matrix
    if structure == "lower_triangular":
        return torch.nn.Parameter(torch.triu(start).to(device, dtype)), torch.triu, torch.triu
    if structure != "generic":
        raise ConfigError("structure", structure, f"numerical objectives support {', '.join(STRUCTURES)}")
    return torch.nn.Parameter(start.to(device, dtype).clone()), (lambda p: p), None


class NumericalEstimator(Estimator):
    """Minimises ``loss`` over T with ``solver`` on the stored tokens (paper recipe: Adam, lr 1e-4,
    batches of 1024 tokens, 10 epochs, T initialised to the identity; ``init=ls`` starts from the
    closed-form solution instead). ``schedule``: ``full_batch`` or ``minibatch`` for the non-Adam
    solvers (module docstring). ``alpha_scale`` (set by ``loss``): ``token_mean`` or ``token_sum``."""


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
        schedule: str = "full_batch",
        precision: str = "float64",
        solver_backend: str = "scipy_torch",
        mse_reduction: str = "sum_hidden",
    ):
        if loss not in LOSSES:
            raise ConfigError("objective.loss", loss, f"choose one of {LOSSES}")
        if solver not in SOLVERS:
            raise ConfigError("objective.solver", solver, f"choose one of {SOLVERS}")
        if schedule not in SCHEDULES:
            raise ConfigError("objective.schedule", schedule, f"choose one of {SCHEDULES}")
        if precision not in PRECISIONS:
            raise ConfigError("objective.precision", precision, f"choose one of {PRECISIONS}")
        if init not in ("identity", "ls"):
            raise ConfigError("objective.init", init, "choose identity or ls")
        check_backend(solver, schedule, solver_backend)
        if mse_reduction not in MSE_REDUCTIONS:
            raise ConfigError("objective.mse_reduction", mse_reduction, f"choose one of {MSE_REDUCTIONS}")
        self.name, self.loss, self.solver, self.schedule = name, loss, solver, schedule
        self.lr, self.batch_tokens, self.epochs, self.init = lr, batch_tokens, epochs, init
        self.max_iter, self.chunk_tokens = max_iter, chunk_tokens
        self.solver_backend, self.mse_reduction = solver_backend, mse_reduction
        self.precision = solver_precision(solver, precision)
        self.alpha_scale = ALPHA_SCALES[loss]
        self.loss_curve: list[float] = []

    @classmethod
    def requirements(cls, objective) -> Requirements:
        """Tokens always; the statistics of its cuts too for ``init=ls``; Adam is mini-batch under
        either schedule."""
        return Requirements(
            statistics=objective.init == "ls",
            tokens=True,
            alpha_scale=ALPHA_SCALES[objective.loss],
            regularizers=REGULARIZERS,
            structures=STRUCTURES,
            solver=objective.solver,
            solver_schedule="minibatch" if objective.solver == "adam" else objective.schedule,
            solver_precision=solver_precision(objective.solver, objective.precision),
        )

    def store_names(self) -> tuple[str, ...]:
        return ("M", "R", "Y") if self.loss in EXACT_LOSSES else ("M", "R")

    def penalty_weight(self, alpha: float, n_tokens: int, hidden: int) -> float:
        """The weight of the penalty next to the batch loss: ``alpha`` for ``token_mean``; for
        ``token_sum``, ``alpha / n_tokens`` (all stored tokens, whatever the batch), and ``alpha /
        (n_tokens * hidden)`` with ``mse_reduction="mean"`` (whose loss is the sum's 1 / (n_tokens *
        hidden)): the same minimiser, the ridge of ``objective=ls alpha``, on both scales."""
        if self.alpha_scale != "token_sum":
            return alpha
        return alpha / (n_tokens * hidden) if self.mse_reduction == "mean" else alpha / n_tokens

    def loss_of(self, mt: torch.Tensor, rows: dict[str, torch.Tensor], set_tokens: int | None = None) -> torch.Tensor:
        """:func:`batch_loss` of this estimator's loss and ``mse_reduction``."""
        return batch_loss(self.loss, mt, rows, set_tokens, self.mse_reduction)

    def fit(
        self,
        store,
        alpha: float,
        regularizer: str,
        structure: str,
        seed: int,
        init_transform: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """Returns T, (hidden, hidden) float64, and an info dict:

        - ``loss_curve``: the loss at the start (Adam and ``minibatch``: of the first batch), then
          the mean batch loss of each epoch (Adam, ``minibatch``; each batch's loss before its
          step) or the objective at each full-batch iteration (``lbfgs``: at each evaluation);
          penalty included;
        - ``final_loss``: its last entry;
        - ``schedule``: as configured (no effect on Adam); ``alpha_scale``: ``token_mean`` or
          ``token_sum``;
        - ``steps``: solver iterations in total (Adam steps; for ``minibatch``, at most one per
          batch); ``batches``: the batches the solver ran on (1 for ``full_batch``);
          ``evaluations``: objective + gradient evaluations (each on its batch, or on all tokens
          for ``full_batch``), line searches included, Hessian-vector products not.

        ``seed`` draws the batches (Adam, ``minibatch``). ``structure``: one of :data:`STRUCTURES`
        (:func:`parametrise`; ``init_transform`` None: each structure's start, T = I, or t1 = t2 = 1
        for ``rank1``)."""
        if structure not in STRUCTURES:
            raise ConfigError("structure", structure, f"objective={self.name} supports {', '.join(STRUCTURES)}")
        device, d = store.compute_device, store.hidden
        start = torch.eye(d, dtype=torch.float64) if init_transform is None else init_transform.cpu()
        dtype = getattr(torch, self.precision)
        param, as_matrix, penalised = parametrise(
            structure, start, device, official_start=init_transform is None, dtype=dtype
        )
        weight = self.penalty_weight(alpha, store.n_tokens, d)
        curve, steps, batches, evaluations = self._minimise(
            store, param, as_matrix, penalised, weight, regularizer, seed
        )
        return as_matrix(param.detach().double()).cpu(), self._summary(curve, steps, batches, evaluations)

    def _minimise(
        self, store, param, as_matrix, penalised, weight, regularizer, seed
    ) -> tuple[list[float], int, int, int]:
        """Run the solver from ``param`` (updated in place) by its schedule. Returns (the loss curve,
        steps, batches, evaluations) as :meth:`fit` reports them."""
        if self.solver == "adam":
            curve, steps, batches = self._adam(store, param, as_matrix, penalised, weight, regularizer, seed)
            return curve, steps, batches, steps
        if self.schedule == "minibatch":
            return self._minibatch(store, param, as_matrix, penalised, weight, regularizer, seed)
        objective = ChunkedObjective(store, self.loss_of, as_matrix, regularizer, weight, self.chunk_tokens, penalised)
        curve, steps, evaluations = self._solve(objective, param, self.max_iter, track=True)
        return curve, steps, 1, evaluations

    def _summary(self, curve: list[float], steps: int, batches: int, evaluations: int) -> dict:
        """The info dict of :meth:`fit`, logged; a loss that became NaN or inf raises :class:`ConfigError`."""
        if not all(torch.isfinite(torch.tensor(curve))):
            raise ConfigError("objective.lr", self.lr, "the loss became NaN or inf; lower the learning rate")
        run = f"{self.name}/{self.solver} ({self.schedule})"
        log.info("%s: loss %.5f -> %.5f in %d steps on %d batches", run, curve[0], curve[-1], steps, batches)
        log.info("loss curve: %s", " ".join(f"{v:.5f}" for v in curve))
        return {
            "loss_curve": curve,
            "final_loss": curve[-1],
            "schedule": self.schedule,
            "alpha_scale": self.alpha_scale,
            "steps": steps,
            "batches": batches,
            "evaluations": evaluations,
        }

    def _adam(self, store, param, as_matrix, penalised, weight, regularizer, seed) -> tuple[list[float], int, int]:
        """Mini-batches of ``batch_tokens`` drawn by a seeded permutation (rows are gathered from
        the store; nothing is copied per epoch); each batch's loss is its mean loss + ``weight`` *
        penalty (of ``penalised(param)``; None: of ``param``). Returns (the loss curve, steps, batches)."""
        penalised = penalised or (lambda p: p)
        optimiser = torch.optim.Adam([param], lr=self.lr)
        generator = torch.Generator().manual_seed(seed)
        curve: list[float] = []
        steps = 0
        n_steps = self.epochs * batches_per_epoch(store.n_tokens, self.batch_tokens)
        with progress_counter(n_steps, f"{self.name}/adam ({self.epochs} epochs)", unit="step") as counter:
            for _ in range(self.epochs):
                total, batches = 0.0, 0
                for indices in shuffled_batches(store.n_tokens, self.batch_tokens, generator):
                    rows = store.rows(indices)
                    mt = rows["M"] @ as_matrix(param)
                    loss = self.loss_of(mt, rows) + penalty(regularizer, weight, penalised(param))
                    if not curve:
                        curve.append(loss.detach().item())
                    optimiser.zero_grad(set_to_none=True)
                    loss.backward()
                    optimiser.step()
                    total, batches = total + loss.detach().item(), batches + 1
                    counter.update(1)
                curve.append(total / batches)
                steps += batches
        return curve, steps, steps

    def _minibatch(
        self, store, param, as_matrix, penalised, weight, regularizer, seed
    ) -> tuple[list[float], int, int, int]:
        """The official code's schedule: for each epoch, for each batch of a seeded shuffle, one
        iteration of the solver on that batch's objective (mean loss over the batch + ``weight`` *
        penalty) from the current T, with fresh solver state. Returns (the loss curve, steps,
        batches, evaluations)."""
        generator = torch.Generator().manual_seed(seed)
        curve: list[float] = []
        steps = batches = evaluations = 0
        n_batches = self.epochs * batches_per_epoch(store.n_tokens, self.batch_tokens)
        desc = f"{self.name}/{self.solver} (minibatch, {self.epochs} epochs)"
        with progress_counter(n_batches, desc, unit="batch") as counter:
            for _ in range(self.epochs):
                total, count = 0.0, 0
                for indices in shuffled_batches(store.n_tokens, self.batch_tokens, generator):
                    batch = StoreBatch(store, indices)
                    if self.solver_backend == "torchmin":
                        values, iterations, evals = self._torchmin_step(
                            batch.tensors, param, as_matrix, penalised, weight, regularizer
                        )
                    else:
                        objective = ChunkedObjective(
                            batch, self.loss_of, as_matrix, regularizer, weight, self.chunk_tokens, penalised
                        )
                        values, iterations, evals = self._solve(
                            objective, param, max_iter=1, track=False, max_eval=1 + MAX_LINE_SEARCH
                        )
                    if not curve:
                        curve.append(values[0])
                    total, count = total + values[0], count + 1
                    steps, evaluations = steps + iterations, evaluations + evals
                    counter.update(1)
                curve.append(total / count)
                batches += count
        return curve, steps, batches, evaluations

    def _torchmin_step(self, rows, param, as_matrix, penalised, weight, regularizer):
        """The official code's step on one batch: torchmin's ``minimize(objective, T, method=...,
        max_iter=1)`` (:data:`TORCHMIN_METHODS`, the library's defaults otherwise: fresh solver state)
        on the batch's loss + ``weight`` * penalty, all of it in ``param``'s dtype at once (``rows``:
        the batch's stored rows); ``param`` takes the result's x. Returns ([the objective at the
        start], iterations, evaluations)."""
        from torchmin import minimize

        rows = {name: t.to(param.dtype) for name, t in rows.items()}
        started: list[float] = []

        def objective(x: torch.Tensor) -> torch.Tensor:
            value = self.loss_of(rows["M"] @ as_matrix(x), rows)
            value = value + penalty(regularizer, weight, x if penalised is None else penalised(x))
            if not started:
                started.append(value.item())
            return value

        result = minimize(objective, param.detach(), method=TORCHMIN_METHODS[self.solver], max_iter=1)
        with torch.no_grad():
            param.copy_(result.x.view_as(param))
        return started, int(result.nit), int(result.nfev)

    def _solve(
        self,
        objective: "ChunkedObjective",
        param: torch.nn.Parameter,
        max_iter: int,
        track: bool,
        max_eval: int | None = None,
    ):
        """Up to ``max_iter`` iterations of the (non-Adam) solver on ``objective`` from ``param``,
        with fresh solver state; updates ``param`` in place. Returns (curve, iterations,
        evaluations): the curve starts with the objective at ``param``; with ``track`` it goes on
        with the objective after each iteration (``lbfgs``: at each evaluation, line search
        included). ``max_eval``: ``lbfgs``'s cap on evaluations (PyTorch's default when None).
        With ``track`` (the full-batch schedule) the iterations report progress."""
        # A mini-batch step (no track) is one iteration of a loop that reports its own progress.
        desc = f"{self.name}/{self.solver} (full batch, at most {max_iter} iterations)"
        mode = None if track else "off"
        with progress_counter(max_iter, desc, unit="iteration", mode=mode) as counter:
            if self.solver == "lbfgs":
                return self._lbfgs(objective, param, max_iter, track, max_eval, counter)
            return self._scipy(objective, param, max_iter, track, counter)

    def _lbfgs(self, objective, param, max_iter: int, track: bool, max_eval: int | None, counter):
        """:meth:`_solve` with PyTorch's L-BFGS (strong-Wolfe line search); returns (curve, iterations,
        evaluations)."""
        # A new optimiser: no history from an earlier call. Its first iteration is a
        # steepest-descent step of initial length min(1, 1/|g|_1) with a strong-Wolfe search.
        optimiser = torch.optim.LBFGS(
            [param],
            lr=1.0,
            max_iter=max_iter,
            max_eval=max_eval,
            history_size=20,
            line_search_fn="strong_wolfe",
            tolerance_grad=1e-9,
            tolerance_change=1e-12,
        )
        curve: list[float] = []

        def closure():
            value, grad = objective.value_and_grad(param.detach())
            param.grad = grad
            if track or not curve:
                curve.append(value)
            # Iterations completed so far: the optimiser counts the one it is in.
            counter.update(max(0, int(optimiser.state[param].get("n_iter", 0)) - 1) - counter.count)
            return torch.tensor(value, dtype=param.dtype)  # the line search reads the value in T's precision

        optimiser.step(closure)
        state = optimiser.state[param]
        counter.update(int(state.get("n_iter", 0)) - counter.count)
        return curve, int(state.get("n_iter", 0)), int(state.get("func_evals", 0))

    def _scipy(self, objective, param, max_iter: int, track: bool, counter):
        """:meth:`_solve` with SciPy's ``minimize`` (:data:`SCIPY_METHODS`); returns (curve, iterations,
        evaluations)."""
        from scipy.optimize import minimize

        flat = FlatObjective(objective, param)
        x0 = param.detach().double().cpu().numpy().ravel()
        curve = [flat.fun(x0)[0]]

        def callback(x):
            curve.append(flat.fun(np.asarray(x))[0])
            counter.update(1)

        method, options = SCIPY_METHODS[self.solver]
        hessp = None if method == "CG" else flat.hessp
        options, callback = {"maxiter": max_iter, **options}, callback if track else None
        result = minimize(flat.fun, x0, jac=True, hessp=hessp, method=method, callback=callback, options=options)
        with torch.no_grad():
            param.copy_(flat.to_torch(result.x))
        return curve, int(result.nit), flat.evaluations


class FlatObjective:
    """``objective`` at flat float64 NumPy vectors (``param``'s shape, dtype and device inside), for
    SciPy: :meth:`fun` (value, gradient; the last four points cached: no pass is repeated) and :meth:`hessp`."""

    def __init__(self, objective, param: torch.Tensor):
        self.objective, self.shape, self.device, self.dtype = objective, param.shape, param.device, param.dtype
        self.cache: dict[bytes, tuple[float, np.ndarray]] = {}
        self.evaluations = 0

    def to_torch(self, x) -> torch.Tensor:
        x = torch.from_numpy(np.asarray(x, dtype=np.float64))
        return x.to(device=self.device, dtype=self.dtype).view(self.shape)

    def fun(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        key = x.tobytes()
        if key not in self.cache:
            value, grad = self.objective.value_and_grad(self.to_torch(x))
            self.evaluations += 1
            if len(self.cache) >= 4:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = (value, grad.double().cpu().numpy().ravel())
        value, grad = self.cache[key]
        return value, grad.copy()

    def hessp(self, x: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self.objective.hvp(self.to_torch(x), self.to_torch(v)).double().cpu().numpy().ravel()


class StoreBatch:
    """The rows ``indices`` of a token store, gathered once (float32, on the compute device),
    behind the store's ``n_tokens`` / ``rows`` interface: a mini-batch for :class:`ChunkedObjective`."""

    def __init__(self, store, indices: torch.Tensor):
        self.compute_device, self.hidden = store.compute_device, store.hidden
        self.n_tokens = indices.numel()
        self.tensors = store.rows(indices)

    def rows(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        if indices.numel() == self.n_tokens and bool((indices == torch.arange(self.n_tokens)).all()):
            return self.tensors
        return {name: t.index_select(0, indices.to(t.device)) for name, t in self.tensors.items()}


class ChunkedObjective:
    """The exact objective over a store (mean loss over all its tokens + ``alpha`` * penalty, with
    ``alpha`` already on the mean scale; ``elasticnet``: its norms summed over all the tokens), its
    gradient and Hessian-vector products, computed chunk by chunk so that memory does not grow with
    the number of tokens, in the parameter's dtype. ``loss``: a name of :data:`LOSSES`, or
    ``loss(mt, rows, set_tokens=...)`` (:meth:`NumericalEstimator.loss_of`). ``penalised``: what the
    penalty acts on (None: the parameter itself)."""

    def __init__(self, store, loss, as_matrix, regularizer: str, alpha: float, chunk_tokens: int, penalised=None):
        if isinstance(loss, str):
            loss = functools.partial(batch_loss, loss)
        self.store, self.loss, self.as_matrix = store, loss, as_matrix
        self.regularizer, self.alpha, self.chunk_tokens = regularizer, alpha, chunk_tokens
        self.penalised = penalised

    def _chunks(self, dtype: torch.dtype):
        """The store's tokens in chunks of ``chunk_tokens`` rows, as ``dtype``, with each chunk's share
        of the tokens."""
        n = self.store.n_tokens
        for i in range(0, n, self.chunk_tokens):
            idx = torch.arange(i, min(i + self.chunk_tokens, n))
            yield {name: t.to(dtype) for name, t in self.store.rows(idx).items()}, idx.numel() / n

    def _chunk_value(self, p: torch.Tensor, rows, weight: float) -> torch.Tensor:
        return weight * self.loss(rows["M"] @ self.as_matrix(p), rows, set_tokens=self.store.n_tokens)

    def value_and_grad(self, param: torch.Tensor) -> tuple[float, torch.Tensor]:
        p = param.detach().clone().requires_grad_(True)
        total, grad = 0.0, torch.zeros_like(p)
        for rows, weight in self._chunks(p.dtype):
            value = self._chunk_value(p, rows, weight)
            grad += torch.autograd.grad(value, p)[0]
            total += value.item()
        reg = penalty(self.regularizer, self.alpha, p if self.penalised is None else self.penalised(p))
        if reg.requires_grad:
            grad += torch.autograd.grad(reg, p)[0]
        return total + reg.item(), grad

    def hvp(self, param: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        p = param.detach().clone().requires_grad_(True)
        out = torch.zeros_like(p)
        for rows, weight in self._chunks(p.dtype):
            (g,) = torch.autograd.grad(self._chunk_value(p, rows, weight), p, create_graph=True)
            out += torch.autograd.grad((g * vector).sum(), p)[0]
        if self.penalised is not None:
            out += self._penalty_hvp(p.detach(), vector)
        elif self.regularizer in ("l2", "l2_to_identity") and self.alpha:
            out += 2 * self.alpha * vector
        return out

    def _penalty_hvp(self, param: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        """The penalty's Hessian-vector product through ``penalised`` (not quadratic in the
        parameter for ``rank1``), by double backward; zero where the penalty has no curvature."""
        p = param.clone().requires_grad_(True)
        reg = penalty(self.regularizer, self.alpha, self.penalised(p))
        if not reg.requires_grad:
            return torch.zeros_like(p)
        (g,) = torch.autograd.grad(reg, p, create_graph=True)
        if not g.requires_grad:
            return torch.zeros_like(p)
        (out,) = torch.autograd.grad((g * vector).sum(), p, allow_unused=True)
        return torch.zeros_like(p) if out is None else out
