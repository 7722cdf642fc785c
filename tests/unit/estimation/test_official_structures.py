"""The official code's other Adam-path options: the rank-1 (``two_vectors``) and lower-triangular
(``thri``) transforms and the ``elasticnet`` loss, against a hand-written copy of the official
``adam_method`` loop (ReplaceMe/utils.py) and against the formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.config import compose_config, validate_config

from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.numerical import ChunkedObjective, NumericalEstimator, batch_loss, rank1_matrix


CPU = torch.device("cpu")


def activations(n_tokens: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """M (n_tokens, hidden) and a target R = M A + noise, float32."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n_tokens, hidden, generator=g)
    a = torch.eye(hidden) + 0.3 * torch.randn(hidden, hidden, generator=g)
    return m, m @ a + 0.3 * torch.randn(n_tokens, hidden, generator=g)


def float32_store(m: torch.Tensor, r: torch.Tensor) -> TokenStore:
    store = TokenStore(("M", "R"), m.shape[0], m.shape[1], CPU, location="cpu", dtype=torch.float32)
    store.write("M", 0, m)
    store.write("R", 0, r)
    return store


class LowerTriangularLinear(torch.nn.Module):
    """The official code's class, as written there."""

    def __init__(self, input_size: int, output_size: int):
        super().__init__()
        identity = torch.eye(min(input_size, output_size))
        self.weight = torch.nn.Parameter(torch.randn(output_size, input_size))
        self.weight.data[: identity.size(0), : identity.size(1)] = identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.tril(self.weight).t()


def official_adam(a1, a2, loss, two_vectors, thri, orders, batch_size=1024, lr=1e-4):
    """``adam_method`` of the official code (a3 = None), on the CPU, its DataLoader's shuffles
    replaced by ``orders`` (one permutation per epoch). Returns T (the official return value;
    for ``thri`` the map its forward pass trains, tril(W)^T: its ``model.triangular_weight`` does
    not exist)."""
    if two_vectors:
        t1 = torch.ones((a1.shape[1], 1), requires_grad=True)
        t2 = torch.ones((a1.shape[1], 1), requires_grad=True)
        optimizer = torch.optim.Adam([t1, t2], lr=lr)
    else:
        model = (
            LowerTriangularLinear(a1.shape[1], a1.shape[1])
            if thri
            else torch.nn.Linear(a1.shape[1], a1.shape[1], bias=False)
        )
        if not thri:
            model.weight.data.copy_(torch.eye(a1.shape[1]))
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def cosine_loss(XA, Y):
        XA_norm = XA / XA.norm(dim=1, keepdim=True)
        Y_norm = Y / Y.norm(dim=1, keepdim=True)
        return 1 - (XA_norm * Y_norm).sum(dim=1).mean()

    loss_fn = {
        "cosine": cosine_loss,
        "mse": torch.nn.MSELoss(reduction="mean"),
        "elasticnet": lambda XA, Y: (
            torch.nn.MSELoss(reduction="mean")(XA, Y) + 0.09 * torch.norm(XA, p=1) + 0.045 * torch.norm(XA, p=2) ** 2
        ),
    }[loss]
    for order in orders:
        for i in range(0, len(order), batch_size):
            X, Y = a1[order[i : i + batch_size]], a2[order[i : i + batch_size]]
            optimizer.zero_grad()
            XA = X.float() @ (t1 @ t2.T) if two_vectors else model(X.float())
            loss_fn(XA, Y.float()).backward()
            optimizer.step()
    if two_vectors:
        return (t1 @ t2.T).detach().double()
    return (torch.tril(model.weight).T if thri else model.weight.T).detach().double()


def seeded_orders(n_tokens: int, epochs: int, seed: int) -> list[torch.Tensor]:
    """The batch order of a job with ``seed``: one seeded permutation per epoch."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n_tokens, generator=g) for _ in range(epochs)]


@pytest.mark.parametrize(
    "structure, loss",
    [
        ("rank1", "cosine"),
        ("rank1", "mse"),  # the official mse is this one / hidden: Adam's steps barely see the scale
        ("rank1", "elasticnet"),
        ("lower_triangular", "cosine"),
        ("lower_triangular", "elasticnet"),
        ("generic", "elasticnet"),
    ],
)
def test_the_adam_recipe_learns_the_official_codes_transform(structure, loss):
    # 3000 tokens: batches of 1024, 1024 and 952 (the last one smaller, as the official DataLoader's).
    n, hidden, epochs, seed = 3000, 12, 10, 3
    m, r = activations(n, hidden, seed=0)
    estimator = NumericalEstimator(loss, loss, lr=1e-4, batch_tokens=1024, epochs=epochs)
    t, info = estimator.fit(float32_store(m, r), 0.0, "none", structure, seed=seed)
    official = official_adam(
        m,
        r,
        loss,
        two_vectors=structure == "rank1",
        thri=structure == "lower_triangular",
        orders=seeded_orders(n, epochs, seed),
    )
    start = torch.ones(hidden, hidden) if structure == "rank1" else torch.eye(hidden)
    moved = float((official - start.double()).abs().max())
    assert moved > 1e-3  # 30 steps of lr 1e-4: T has moved, by far more than the tolerance below
    torch.testing.assert_close(t, official, rtol=0, atol=2e-6)
    assert info["steps"] == info["batches"] == 30


def test_rank1_is_rank_one_and_lower_triangular_is_t_with_zeros_below_its_diagonal():
    m, r = activations(1024, 10, seed=1)
    store = float32_store(m, r)
    estimator = NumericalEstimator("mse", "mse", lr=1e-2, batch_tokens=128, epochs=3)
    rank1, _ = estimator.fit(store, 0.0, "none", "rank1", seed=0)
    singular = np.linalg.svd(rank1.numpy(), compute_uv=False)
    assert singular[0] > 1 and singular[1] < 1e-12 * singular[0]
    triangular, _ = estimator.fit(store, 0.0, "none", "lower_triangular", seed=0)
    below = np.tril_indices(10, k=-1)
    assert (triangular.numpy()[below] == 0).all()  # exactly: X T with T = tril(W)^T, upper triangular
    above = np.triu_indices(10, k=1)
    assert np.abs(triangular.numpy()[above]).min() > 0  # every entry above the diagonal trains
    # the map: output coordinate j reads input coordinates i <= j only
    x = torch.zeros(1, 10, dtype=torch.float64)
    x[0, 7] = 1.0
    assert (x @ triangular)[0, :7].abs().max() == 0 and (x @ triangular)[0, 7:].abs().min() > 0


def test_the_elasticnet_loss_is_the_official_formula_on_a_batch():
    m, r = activations(300, 8, seed=2)
    t = torch.eye(8) + 0.1 * torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    mt = m @ t
    value = batch_loss("elasticnet", mt, {"R": r})
    xa, y = mt.double().numpy(), r.double().numpy()
    formula = ((xa - y) ** 2).sum() / xa.size + 0.09 * np.abs(xa).sum() + 0.045 * (xa**2).sum()
    assert float(value) == pytest.approx(formula, rel=1e-5)
    # the norms are sums over the batch: the half batch's norms weigh half as much next to its MSE
    half = batch_loss("elasticnet", mt[:150], {"R": r[:150]})
    mse_half = ((xa[:150] - y[:150]) ** 2).mean()
    assert float(half) - mse_half == pytest.approx((formula - ((xa - y) ** 2).mean()) / 2, rel=0.2)


@pytest.mark.parametrize("solver, schedule", [("lbfgs", "full_batch"), ("nlcg", "minibatch")])
def test_elasticnet_over_chunks_is_the_formula_over_the_whole_batch(solver, schedule):
    """A chunked objective (chunks of 100 tokens) adds up to the formula over its whole set: all
    stored tokens for full_batch, each batch of 256 for minibatch."""
    n, hidden = 1000, 8
    m, r = activations(n, hidden, seed=4)
    estimator = NumericalEstimator(
        "elasticnet",
        "elasticnet",
        solver=solver,
        schedule=schedule,
        batch_tokens=256,
        epochs=1,
        max_iter=1,
        chunk_tokens=100,
    )
    _, info = estimator.fit(float32_store(m, r), 0.0, "none", "generic", seed=6)
    first = slice(None) if schedule == "full_batch" else seeded_orders(n, 1, 6)[0][:256]
    xa, y = m[first].double().numpy(), r[first].double().numpy()  # T = I at the start
    formula = ((xa - y) ** 2).mean() + 0.09 * np.abs(xa).sum() + 0.045 * (xa**2).sum()
    assert info["loss_curve"][0] == pytest.approx(formula, rel=1e-5)


@pytest.mark.parametrize(
    "loss, structure, regularizer",
    [("elasticnet", "generic", "none"), ("mse", "rank1", "l2"), ("cosine", "lower_triangular", "l2_to_identity")],
)
def test_chunked_gradients_and_hessian_products_match_autograd_on_the_whole_objective(loss, structure, regularizer):
    n, hidden, alpha = 400, 6, 0.05
    m, r = activations(n, hidden, seed=5)
    store = float32_store(m, r)
    g = torch.Generator().manual_seed(1)
    shape = (hidden, 2) if structure == "rank1" else (hidden, hidden)
    param = torch.randn(shape, generator=g).double()
    vector = torch.randn(shape, generator=g).double()
    as_matrix = {"generic": lambda p: p, "rank1": rank1_matrix, "lower_triangular": torch.triu}[structure]
    penalised = None if structure == "generic" else as_matrix
    store.compute_device = CPU

    def whole(p):  # written out on all tokens at once, float64
        xa, y = m.double() @ as_matrix(p), r.double()
        if loss == "elasticnet":
            data = ((xa - y) ** 2).mean() + 0.09 * xa.abs().sum() + 0.045 * (xa**2).sum()
        elif loss == "mse":
            data = ((xa - y) ** 2).sum(1).mean()
        else:
            data = (1 - (xa * y).sum(1) / (xa.norm(dim=1) * y.norm(dim=1))).mean()
        t = as_matrix(p)
        if regularizer == "l2":
            return data + alpha * (t**2).sum()
        if regularizer == "l2_to_identity":
            return data + alpha * ((t - torch.eye(hidden, dtype=t.dtype)) ** 2).sum()
        return data

    objective = ChunkedObjective(store, loss, as_matrix, regularizer, alpha, 150, penalised)
    value, grad = objective.value_and_grad(param.float())
    p = param.clone().requires_grad_(True)
    expected_grad = torch.autograd.grad(whole(p), p)[0]
    assert value == pytest.approx(float(whole(param)), rel=1e-4)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-3, atol=1e-3 * float(expected_grad.abs().max()))
    _, expected_hvp = torch.autograd.functional.hvp(whole, param, vector)
    hvp = objective.hvp(param.float(), vector.float()).double()
    torch.testing.assert_close(hvp, expected_hvp, rtol=1e-3, atol=1e-3 * float(expected_hvp.abs().max()))


def test_an_ls_start_of_rank1_is_the_best_rank_one_approximation():
    m, r = activations(600, 8, seed=7)
    start = torch.linalg.lstsq(m.double(), r.double()).solution
    u, s, vh = np.linalg.svd(start.numpy())
    best = s[0] * np.outer(u[:, 0], vh[0])
    estimator = NumericalEstimator("mse", "mse", solver="lbfgs", max_iter=1)
    _, info = estimator.fit(float32_store(m, r), 0.0, "none", "rank1", seed=0, init_transform=start)
    expected = ((m.double().numpy() @ best - r.double().numpy()) ** 2).sum(1).mean()
    assert info["loss_curve"][0] == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("structure", ["rank1", "lower_triangular"])
def test_the_closed_form_refuses_the_adam_path_structures_before_anything_loads(structure):
    with pytest.raises(ConfigError) as err:
        validate_config(compose_config([f"structure={structure}"]))  # objective=ls
    assert str(err.value) == f"structure='{structure}': objective=ls supports generic or diagonal or orthonormal"
    validate_config(compose_config([f"structure={structure}", "objective=elasticnet"]))
