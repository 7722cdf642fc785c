"""Numerical objectives on a token store, against the closed form and each other."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.numerical import CPU, CUT

from replaceme_exp.capture.statistics import LinearStats
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation import ridge_solve
from replaceme_exp.estimation.numerical import ChunkedObjective, NumericalEstimator, penalty, regularizer_warning


def random_store(n_tokens, hidden, seed, target=None, noise=0.3):
    """A float32 store of random M and R = M T_true + noise (or R = ``target(M)``), with the
    float64 LS statistics of exactly the stored rows."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n_tokens, hidden, generator=g)
    if target is None:
        t_true = torch.eye(hidden) + 0.3 * torch.randn(hidden, hidden, generator=g)
        r = m @ t_true + noise * torch.randn(n_tokens, hidden, generator=g)
    else:
        r = target(m)
    store = TokenStore(("M", "R"), n_tokens, hidden, CPU, location="cpu", dtype=torch.float32)
    store.write("M", 0, m)
    store.write("R", 0, r)
    m64, r64 = m.double(), r.double()
    stats = LinearStats(CUT, m64.T @ m64, m64.T @ r64, float(r64.pow(2).sum()), n_tokens)
    return store, stats


@pytest.mark.parametrize("solver, tolerance", [("lbfgs", 2e-7), ("trust_ncg", 1e-8), ("newton_cg", 1e-8)])
def test_the_solvers_reach_the_closed_form_of_the_stored_rows_in_float64(solver, tolerance, monkeypatch):
    # in float32 (objective.precision=float32, the official code's) they stop 4-500x farther:
    # lbfgs 8.6e-7, trust_ncg 3.7e-8, newton_cg 5.5e-6 from the closed form of the same rows
    store, stats = random_store(400, 16, seed=2)
    evaluated = set()
    value_and_grad = ChunkedObjective.value_and_grad

    def recorded(self, param):
        evaluated.add(param.dtype)
        return value_and_grad(self, param)

    monkeypatch.setattr(ChunkedObjective, "value_and_grad", recorded)
    estimator = NumericalEstimator("mse", "mse", solver=solver, max_iter=500, chunk_tokens=128)
    t, _ = estimator.fit(store, 0.0, "none", "generic", seed=0)
    closed = ridge_solve(stats)
    assert evaluated == {torch.float64}
    assert float((t - closed).norm() / closed.norm()) < tolerance
    evaluated.clear()
    in_float32 = NumericalEstimator("mse", "mse", solver=solver, max_iter=5, precision="float32")
    in_float32.fit(store, 0.0, "none", "generic", seed=0)
    assert evaluated == {torch.float32}


def test_mse_l2_alpha_is_the_ridge_alpha_of_ls():
    # sum_tokens ||M T - R||^2 + alpha ||T||^2, as objective=ls: M^T M ~ N I, so alpha = N halves T.
    n, hidden, alpha = 300, 12, 300.0
    store, stats = random_store(n, hidden, seed=0)
    estimator = NumericalEstimator("mse", "mse", solver="lbfgs", max_iter=300, chunk_tokens=128)
    t, info = estimator.fit(store, alpha, "l2", "generic", seed=0)
    ridge = ridge_solve(stats, alpha=alpha)
    per_token_mean = ridge_solve(stats, alpha=alpha * n)  # the scale alpha had before
    assert float((t - ridge).norm() / ridge.norm()) < 1e-3
    assert float((per_token_mean - ridge).norm() / ridge.norm()) > 0.3
    assert info["alpha_scale"] == "token_sum" and info["schedule"] == "full_batch" and info["batches"] == 1


@pytest.mark.parametrize(
    "loss, scale", [("mse", "token_sum"), ("cosine", "token_mean"), ("cosine_exact", "token_mean")]
)
def test_alpha_scale_follows_the_loss(loss, scale):
    assert NumericalEstimator(loss, loss).alpha_scale == scale
    assert NumericalEstimator(loss, loss, solver="nlcg", schedule="minibatch").alpha_scale == scale


@pytest.mark.parametrize(
    "solver, schedule",
    [("adam", "full_batch"), ("adam", "minibatch"), ("lbfgs", "full_batch")]
    + [(s, "minibatch") for s in ("lbfgs", "nlcg", "trust_ncg", "newton_cg")],
)
@pytest.mark.parametrize("regularizer", ["l1", "l2"])
def test_every_path_weighs_the_penalty_by_alpha_over_the_stored_tokens_for_mse(solver, schedule, regularizer):
    # R = M: T = I has no data loss, so the starting loss is the penalty alone, batch or not.
    n, hidden, alpha = 200, 8, 3.0
    store, _ = random_store(n, hidden, seed=1, target=lambda m: m)
    kwargs = dict(solver=solver, schedule=schedule, batch_tokens=64, epochs=1, max_iter=1, lr=1e-3)
    _, info = NumericalEstimator("mse", "mse", **kwargs).fit(store, alpha, regularizer, "generic", seed=0)
    assert info["loss_curve"][0] == pytest.approx(alpha * hidden / n, rel=1e-5)
    _, info = NumericalEstimator("cosine", "cosine", **kwargs).fit(store, alpha, regularizer, "generic", seed=0)
    assert info["loss_curve"][0] == pytest.approx(alpha * hidden, rel=1e-5)
    assert info["alpha_scale"] == "token_mean"


@pytest.mark.parametrize("solver", ["lbfgs", "nlcg", "trust_ncg", "newton_cg"])
def test_minibatch_schedule_takes_one_solver_step_per_shuffled_batch(solver):
    n, hidden, batch_tokens, epochs = 300, 12, 64, 3
    store, _ = random_store(n, hidden, seed=2)
    estimator = NumericalEstimator(
        "cosine", "cosine", solver=solver, schedule="minibatch", batch_tokens=batch_tokens, epochs=epochs, max_iter=20
    )
    t, info = estimator.fit(store, 1e-4, "l1", "generic", seed=0)
    assert info["schedule"] == "minibatch"
    assert info["batches"] == info["steps"] == epochs * math.ceil(n / batch_tokens) == 15
    assert len(info["loss_curve"]) == epochs + 1 and info["loss_curve"][-1] < info["loss_curve"][0]
    again, _ = estimator.fit(store, 1e-4, "l1", "generic", seed=0)
    other_seed, _ = estimator.fit(store, 1e-4, "l1", "generic", seed=1)
    assert torch.equal(t, again) and not torch.equal(t, other_seed)
    full_batch = NumericalEstimator("cosine", "cosine", solver=solver, max_iter=20)
    t_full, info_full = full_batch.fit(store, 1e-4, "l1", "generic", seed=0)
    assert info_full["schedule"] == "full_batch" and info_full["batches"] == 1
    assert float((t - t_full).norm()) > 1e-3


def test_minibatch_lbfgs_step_runs_a_strong_wolfe_line_search():
    # mse: |g|_1 is large, so the first L-BFGS step min(1, 1/|g|_1) is far too short and the
    # strong-Wolfe search must extend it: more than one trial point per batch.
    store, _ = random_store(300, 12, seed=5)
    estimator = NumericalEstimator("mse", "mse", solver="lbfgs", schedule="minibatch", batch_tokens=100, epochs=2)
    _, info = estimator.fit(store, 0.0, "none", "generic", seed=0)
    assert info["steps"] == info["batches"] == 6
    assert info["evaluations"] > 2 * info["batches"]  # the start of each batch + at least 2 trials
    assert info["loss_curve"][-1] < 0.5 * info["loss_curve"][0]


def test_adam_accepts_both_schedules_and_runs_the_same_thing():
    store, _ = random_store(200, 8, seed=3)
    kwargs = dict(lr=1e-2, batch_tokens=64, epochs=2)
    runs = [NumericalEstimator("cosine", "cosine", schedule=s, **kwargs) for s in ("full_batch", "minibatch")]
    (a, info_a), (b, info_b) = (e.fit(store, 0.0, "none", "generic", seed=7) for e in runs)
    assert torch.equal(a, b) and info_a["loss_curve"] == info_b["loss_curve"]
    assert (info_a["schedule"], info_b["schedule"]) == ("full_batch", "minibatch")
    assert info_a["steps"] == info_a["batches"] == 2 * 4
    with pytest.raises(ConfigError, match="objective.schedule='online'"):
        NumericalEstimator("cosine", "cosine", schedule="online")


def test_fit_has_no_mask_ratio():
    store, _ = random_store(64, 8, seed=4)
    with pytest.raises(TypeError):
        NumericalEstimator("cosine", "cosine", epochs=1).fit(store, 0.0, "none", "generic", 0, mask_ratio=0.2)


def test_a_penalty_to_identity_is_the_penalty_of_t_minus_i():
    t = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    eye = torch.eye(6)
    assert penalty("l2_to_identity", 0.5, t).item() == pytest.approx(0.5 * (t - eye).pow(2).sum().item())
    assert penalty("l1_to_identity", 0.5, t).item() == pytest.approx(0.5 * (t - eye).abs().sum().item())
    assert penalty("l2", 0.5, t).item() == pytest.approx(0.5 * t.pow(2).sum().item())
    assert penalty("l2_to_identity", 3.0, eye).item() == 0 == penalty("l1_to_identity", 3.0, torch.ones(6)).item()


def test_with_the_cosine_loss_a_penalty_on_t_shrinks_t_with_the_steps_and_one_on_t_minus_i_settles():
    """cos(M T, R) does not change with T's scale: the literal L2 has no minimiser and Adam keeps
    shrinking T as the steps grow; L2 on T - I has one, reached and kept."""
    a = torch.eye(8) + 0.3 * torch.randn(8, 8, generator=torch.Generator().manual_seed(5))
    store, _ = random_store(256, 8, seed=2, target=lambda m: m @ a)
    norms, directions = {}, {}
    for regularizer in ("l2", "l2_to_identity"):
        for epochs in (20, 80, 320):
            estimator = NumericalEstimator("cosine", "cosine", lr=1e-2, batch_tokens=64, epochs=epochs)
            t, _ = estimator.fit(store, 0.01, regularizer, "generic", seed=0)
            norms[regularizer, epochs] = float(t.norm())
            directions[regularizer, epochs] = float((t / t.norm() - a / a.norm()).norm())
    assert norms["l2", 80] < 0.5 * norms["l2", 20] and norms["l2", 320] < norms["l2", 80]
    assert norms["l2_to_identity", 320] == pytest.approx(norms["l2_to_identity", 80], rel=0.01)
    assert norms["l2_to_identity", 320] > 5 * norms["l2", 320]
    assert max(directions.values()) < 0.15  # both find the direction; only the scale differs
    assert "invariant to T's scale" in regularizer_warning("cosine", "l2", 0.01)
    assert regularizer_warning("cosine", "l2_to_identity", 0.01) is None
    assert regularizer_warning("cosine_exact", "l2", 0.01) is None and regularizer_warning("cosine", "l2", 0) is None
