"""The official code's solvers and losses (ReplaceMe/utils.py): torchmin's ``minimize(..., max_iter=1)``
once per batch (``optimizing_method``), the ``nn.MSELoss(reduction="mean")`` scale, and the
``accurate=True`` forms of the losses (prediction ``X A + Z`` = M T + Y against L), each against a
hand-written copy of the official loop or formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.config import compose_config, validate_config
from torchmin import minimize

from replaceme_exp.capture.statistics import LinearStats
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation import ridge_solve
from replaceme_exp.estimation.numerical import NumericalEstimator, batch_loss
from replaceme_exp.pipeline.spec import JobSpec


CPU = torch.device("cpu")


# Our solver names and the methods of theirs the official configs pass ("adam, cg, l-bfgs, trust-ncg").
OFFICIAL_METHODS = {"lbfgs": "l-bfgs", "nlcg": "cg", "trust_ncg": "trust-ncg", "newton_cg": "newton-cg"}


def store_of(**rows: torch.Tensor) -> TokenStore:
    """A float32 store holding ``rows`` (name -> (tokens, hidden))."""
    first = next(iter(rows.values()))
    store = TokenStore(tuple(rows), first.shape[0], first.shape[1], CPU, location="cpu", dtype=torch.float32)
    for name, value in rows.items():
        store.write(name, 0, value)
    return store


def activations(n: int, hidden: int, seed: int, scale: float = 0.3, noise: float = 0.3):
    """M, R = M A + noise and Y (n, hidden) float32, A = I + ``scale`` * noise."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, hidden, generator=g)
    a = torch.eye(hidden) + scale * torch.randn(hidden, hidden, generator=g)
    r = m @ a + noise * torch.randn(n, hidden, generator=g)
    return m, r, 2 * torch.randn(n, hidden, generator=g)


def seeded_batches(n: int, batch: int, epochs: int, seed: int) -> list[torch.Tensor]:
    """A job's batches with ``seed``: one seeded permutation per epoch, cut into ``batch`` tokens."""
    g = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(n, generator=g) for _ in range(epochs)]
    return [order[i : i + batch] for order in orders for i in range(0, n, batch)]


def official_cosine_loss(XA, Y):
    XA_norm = XA / XA.norm(dim=1, keepdim=True)
    Y_norm = Y / Y.norm(dim=1, keepdim=True)
    return 1 - (XA_norm * Y_norm).sum(dim=1).mean()


def official_optimizing_method(a1, a2, a3, solver, batches, dtype):
    """``optimizing_method`` of the official code on the CPU, its DataLoader's shuffles replaced by
    ``batches``, its float32 by ``dtype``: T (float64)."""
    A = torch.eye(a1.shape[1], dtype=dtype, requires_grad=True)
    for idx in batches:
        X, Y, Z = a1[idx].to(dtype), a2[idx].to(dtype), None if a3 is None else a3[idx].to(dtype)

        def objective(A_tensor, X=X, Y=Y, Z=Z):
            XA = X @ A_tensor
            if Z is not None:
                XA += Z
            return official_cosine_loss(XA, Y)

        result = minimize(objective, A, method=solver, max_iter=1)
        A = result.x
    return A.detach().double()


def official_adam_method(a1, a2, a3, loss, batches, lr):
    """``adam_method`` of the official code (generic T) on the CPU, its shuffles replaced by ``batches``."""
    model = torch.nn.Linear(a1.shape[1], a1.shape[1], bias=False)
    model.weight.data.copy_(torch.eye(a1.shape[1]))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = {
        "cosine": official_cosine_loss,
        "mse": torch.nn.MSELoss(reduction="mean"),
        "elasticnet": lambda XA, Y: (
            torch.nn.MSELoss(reduction="mean")(XA, Y) + 0.09 * torch.norm(XA, p=1) + 0.045 * torch.norm(XA, p=2) ** 2
        ),
    }[loss]
    for idx in batches:
        optimizer.zero_grad()
        XA = model(a1[idx].float())
        if a3 is not None:
            XA += a3[idx].float()
        loss_fn(XA, a2[idx].float()).backward()
        optimizer.step()
    return model.weight.T.detach().double()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("solver", ["lbfgs", "nlcg", "trust_ncg", "newton_cg"])
def test_the_torchmin_backend_is_the_official_loop(solver):
    # float64: the line searches and trust regions decide the same way in both (float32: below)
    n, hidden, batch, epochs, seed = 200, 6, 64, 2, 0
    m, r, _ = activations(n, hidden, seed=2)
    store = store_of(M=m, R=r)
    official = official_optimizing_method(
        m, r, None, OFFICIAL_METHODS[solver], seeded_batches(n, batch, epochs, seed), torch.float64
    )
    kwargs = dict(solver=solver, schedule="minibatch", batch_tokens=batch, epochs=epochs, precision="float64")
    t, info = NumericalEstimator("cosine", "cosine", solver_backend="torchmin", **kwargs).fit(
        store, 0.0, "none", "generic", seed=seed
    )
    assert relative(official, torch.eye(hidden, dtype=torch.float64)) > 0.05  # T moved
    assert relative(t, official) < 1e-10
    assert info["batches"] == info["steps"] == epochs * 4
    assert len(info["loss_curve"]) == epochs + 1 and info["loss_curve"][-1] < info["loss_curve"][0]
    stand_in, _ = NumericalEstimator("cosine", "cosine", solver_backend="scipy_torch", **kwargs).fit(
        store, 0.0, "none", "generic", seed=seed
    )
    if solver in ("nlcg", "newton_cg"):  # SciPy's CG and Newton-CG take other steps than torchmin's
        assert relative(stand_in, official) > 1e-2
    else:  # torch.optim.LBFGS and SciPy's trust-ncg take torchmin's first step here
        assert relative(stand_in, official) < 1e-10


@pytest.mark.parametrize("solver", ["lbfgs", "nlcg"])
def test_the_torchmin_backend_in_float32_follows_the_official_float32_loop(solver, monkeypatch):
    n, hidden, batch, epochs, seed = 200, 6, 64, 2, 1
    m, r, _ = activations(n, hidden, seed=3)
    batches = seeded_batches(n, batch, epochs, seed)
    official = official_optimizing_method(m, r, None, OFFICIAL_METHODS[solver], batches, torch.float32)
    kwargs = dict(solver=solver, schedule="minibatch", batch_tokens=batch, epochs=epochs, precision="float32")
    t, _ = NumericalEstimator("cosine", "cosine", solver_backend="torchmin", **kwargs).fit(
        store_of(M=m, R=r), 0.0, "none", "generic", seed=seed
    )
    # our cosine (with an epsilon) rounds otherwise than theirs, and CG's line search amplifies it
    assert relative(t, official) < 1e-3
    # the official loop on our cosine's arithmetic: the same float32 numbers
    ours = lambda XA, Y: (1 - torch.nn.functional.cosine_similarity(XA, Y, dim=-1, eps=1e-8)).mean()  # noqa: E731
    monkeypatch.setattr(f"{__name__}.official_cosine_loss", ours)
    assert torch.equal(t, official_optimizing_method(m, r, None, OFFICIAL_METHODS[solver], batches, torch.float32))
    stand_in, _ = NumericalEstimator("cosine", "cosine", solver_backend="scipy_torch", **kwargs).fit(
        store_of(M=m, R=r), 0.0, "none", "generic", seed=seed
    )
    assert relative(stand_in, official) > (1e-2 if solver == "nlcg" else 0)


def test_the_torchmin_backend_runs_the_accurate_cosine_and_the_structures_and_penalties():
    n, hidden, batch, seed = 200, 6, 64, 4
    m, r, y = activations(n, hidden, seed=5)
    store = store_of(M=m, R=r, Y=y)
    kwargs = dict(solver="nlcg", schedule="minibatch", batch_tokens=batch, epochs=1, precision="float64")
    t, _ = NumericalEstimator("cosine_exact", "cosine_exact", solver_backend="torchmin", **kwargs).fit(
        store, 0.0, "none", "generic", seed=seed
    )
    target = r.double() + y.double()  # the store holds R and Y: L = R + Y, exactly in float64
    official = official_optimizing_method(m, target, y, "cg", seeded_batches(n, batch, 1, seed), torch.float64)
    assert relative(t, official) < 1e-10
    # R = M: T = I has no data loss, so the start is the penalty alone (alpha / N on mse's scale)
    estimator = NumericalEstimator("mse", "mse", solver_backend="torchmin", **kwargs)
    for structure in ("diagonal", "lower_triangular"):
        t, info = estimator.fit(store_of(M=m, R=m), 3.0, "l2", structure, seed=seed)
        assert info["loss_curve"][0] == pytest.approx(3.0 * hidden / n, rel=1e-9)
        assert info["loss_curve"][-1] < info["loss_curve"][0]
        kept = torch.diag(t.diagonal()) if structure == "diagonal" else torch.triu(t)
        assert torch.equal(t, kept) and not torch.equal(t, torch.eye(hidden, dtype=t.dtype))
    t, _ = estimator.fit(store_of(M=m, R=r), 0.0, "none", "rank1", seed=seed)
    assert np.linalg.matrix_rank(t.numpy()) == 1


def test_the_torchmin_backend_refuses_the_full_batch_schedule_in_one_line():
    with pytest.raises(ConfigError) as err:
        NumericalEstimator("cosine", "cosine", solver="lbfgs", solver_backend="torchmin")
    assert str(err.value).startswith("objective.solver_backend='torchmin': runs the official code's one step")
    with pytest.raises(ConfigError, match="objective.solver_backend='torchmin'"):
        validate_config(
            compose_config(["objective=cosine", "objective.solver=lbfgs", "objective.solver_backend=torchmin"])
        )


def test_protocol_official_runs_torchmin_and_the_mean_mse_and_records_both():
    lbfgs = ["objective=cosine", "objective.solver=lbfgs"]
    official = JobSpec.from_config(compose_config([*lbfgs, "protocol=official"]))
    assert official.config.objective.solver_backend == "torchmin"
    assert official.setting_columns()["solver_backend"] == "torchmin"
    paper = JobSpec.from_config(compose_config([*lbfgs, "solver_schedule=minibatch"]))
    assert paper.config.objective.solver_backend == "scipy_torch"
    assert paper.setting_columns()["solver_backend"] == "scipy_torch"
    typed = JobSpec.from_config(compose_config([*lbfgs, "protocol=official", "objective.solver_backend=scipy_torch"]))
    assert typed.config.objective.solver_backend == "scipy_torch" and typed.config_hash != official.config_hash
    # official full batch: torchmin cannot run it, the stand-in does
    full = JobSpec.from_config(compose_config([*lbfgs, "protocol=official", "solver_schedule=full_batch"]))
    assert full.config.objective.solver_backend == "scipy_torch"
    # Adam: the backend does not act (None in the row, not in the hash)
    adam = JobSpec.from_config(compose_config(["objective=cosine", "protocol=official"]))
    adam_typed = JobSpec.from_config(
        compose_config(["objective=cosine", "protocol=official", "objective.solver_backend=scipy_torch"])
    )
    assert adam.setting_columns()["solver_backend"] is None and adam.config_hash == adam_typed.config_hash
    mse = JobSpec.from_config(compose_config(["objective=mse", "protocol=official"]))
    assert (mse.config.objective.mse_reduction, mse.setting_columns()["mse_reduction"]) == ("mean", "mean")
    mse_paper = JobSpec.from_config(compose_config(["objective=mse"]))
    assert mse_paper.setting_columns()["mse_reduction"] == "sum_hidden"
    assert official.setting_columns()["mse_reduction"] is None  # cosine: no MSE


def test_adam_on_the_official_mse_scale_is_the_official_adam_and_eps_tells_the_scales_apart():
    # R = M A with A within 1e-5 of I: the gradients are near Adam's eps (1e-8) on the mean scale,
    # d = 16 times farther above it on the sum over hidden, so the steps differ.
    n, hidden, batch, epochs, seed, lr = 512, 16, 128, 2, 0, 1e-4
    m, r, _ = activations(n, hidden, seed=6, scale=1e-5, noise=0.0)
    store = store_of(M=m, R=r)
    batches = seeded_batches(n, batch, epochs, seed)
    official = official_adam_method(m, r, None, "mse", batches, lr)
    runs = {}
    for reduction in ("mean", "sum_hidden"):
        estimator = NumericalEstimator("mse", "mse", lr=lr, batch_tokens=batch, epochs=epochs, mse_reduction=reduction)
        runs[reduction], _ = estimator.fit(store, 0.0, "none", "generic", seed=seed)
    identity = torch.eye(hidden, dtype=torch.float64)
    moved = float((official - identity).abs().max())
    assert moved > 5e-5
    torch.testing.assert_close(runs["mean"], official, rtol=0, atol=1e-3 * moved)
    assert float((runs["sum_hidden"] - official).abs().max()) > 0.2 * moved  # measured: 0.52 x moved


@pytest.mark.parametrize("reduction", ["mean", "sum_hidden"])
def test_mse_l2_alpha_is_the_ridge_alpha_of_ls_on_both_scales(reduction):
    n, hidden, alpha = 300, 12, 300.0
    m, r, _ = activations(n, hidden, seed=0)
    m64, r64 = m.double(), r.double()
    stats = LinearStats((2, 4), m64.T @ m64, m64.T @ r64, float(r64.pow(2).sum()), n)
    estimator = NumericalEstimator(
        "mse", "mse", solver="lbfgs", max_iter=300, chunk_tokens=128, mse_reduction=reduction
    )
    t, info = estimator.fit(store_of(M=m, R=r), alpha, "l2", "generic", seed=0)
    ridge = ridge_solve(stats, alpha=alpha)
    assert relative(t, ridge) < 1e-3
    assert relative(ridge_solve(stats, alpha=alpha * hidden), ridge) > 0.1  # what a d-times weight would give
    assert info["alpha_scale"] == "token_sum"


def test_the_mean_mse_is_the_official_mseloss():
    m, r, _ = activations(300, 8, seed=1)
    t = torch.eye(8) + 0.1 * torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    mt = m @ t
    official = torch.nn.MSELoss(reduction="mean")(mt.double(), r.double())
    assert float(batch_loss("mse", mt, {"R": r}, mse_reduction="mean")) == pytest.approx(float(official), rel=1e-6)
    assert float(batch_loss("mse", mt, {"R": r})) == pytest.approx(8 * float(official), rel=1e-6)
    with pytest.raises(ConfigError, match="objective.mse_reduction='sum'"):
        NumericalEstimator("mse", "mse", mse_reduction="sum")


def test_the_accurate_losses_are_the_official_formulas_of_m_t_plus_y_against_l():
    m, r, y = activations(300, 8, seed=2)
    t = torch.eye(8) + 0.1 * torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    mt, target = m @ t, (r + y).double().numpy()  # the official a2 = hidden_n = L, a3 = hidden_i - mlp = Y
    rows = {"R": r, "Y": y}
    xa = (mt + y).double().numpy()  # XA += Z
    mse = ((xa - target) ** 2).mean()
    elasticnet = mse + 0.09 * np.abs(xa).sum() + 0.045 * (xa**2).sum()
    assert float(batch_loss("elasticnet_exact", mt, rows)) == pytest.approx(elasticnet, rel=1e-5)
    assert float(batch_loss("mse_exact", mt, rows, mse_reduction="mean")) == pytest.approx(mse, rel=1e-4)
    assert float(batch_loss("mse_exact", mt, rows)) == pytest.approx(8 * mse, rel=1e-4)
    # the norms are of M T + Y: not the non-accurate loss, whose norms are of M T
    assert abs(float(batch_loss("elasticnet", mt, rows)) - elasticnet) > 0.1 * elasticnet
    assert NumericalEstimator("elasticnet_exact", "elasticnet_exact").store_names() == ("M", "R", "Y")
    assert NumericalEstimator("mse_exact", "mse_exact").store_names() == ("M", "R", "Y")
    assert NumericalEstimator("mse", "mse").store_names() == ("M", "R")


@pytest.mark.parametrize("loss", ["elasticnet", "mse"])
def test_adam_on_an_accurate_loss_is_the_official_accurate_adam(loss):
    n, hidden, batch, epochs, seed, lr = 600, 8, 256, 2, 3, 1e-3
    m, r, y = activations(n, hidden, seed=4)
    batches = seeded_batches(n, batch, epochs, seed)
    official = official_adam_method(m, r + y, y, loss, batches, lr)
    estimator = NumericalEstimator(
        f"{loss}_exact", f"{loss}_exact", lr=lr, batch_tokens=batch, epochs=epochs, mse_reduction="mean"
    )
    t, _ = estimator.fit(store_of(M=m, R=r, Y=y), 0.0, "none", "generic", seed=seed)
    moved = float((official - torch.eye(hidden, dtype=torch.float64)).abs().max())
    assert moved > 1e-3
    torch.testing.assert_close(t, official, rtol=0, atol=1e-3 * moved)
    if loss == "elasticnet":  # the non-accurate form learns another T
        other, _ = NumericalEstimator(loss, loss, lr=lr, batch_tokens=batch, epochs=epochs).fit(
            store_of(M=m, R=r), 0.0, "none", "generic", seed=seed
        )
        assert float((other - official).abs().max()) > 0.1 * moved


@pytest.mark.parametrize("option", ["mse_exact", "elasticnet_exact"])
def test_the_accurate_options_compose_and_keep_y(option):
    spec = JobSpec.from_config(compose_config([f"objective={option}"]))
    assert spec.config.objective.loss == option
    assert spec.estimator().store_names() == ("M", "R", "Y")


def test_torchmin_is_the_version_the_official_code_installed_and_keeps_a_small_one_step_change():
    """The official setup.py (May 2025) left torchmin unpinned: it installed 0.0.2. 0.1.0 (2026) raised
    ``xtol`` to 1e-8, so a step whose loss changes by 5e-9 ends before ``x`` moves; 0.0.2 takes it."""
    from importlib.metadata import version

    assert version("pytorch-minimize") == "0.0.2"
    a = torch.full((1,), 1e-4, dtype=torch.float64)
    result = minimize(lambda x: 0.5 * ((x - a) ** 2).sum(), torch.zeros(1, dtype=torch.float64), method="l-bfgs", max_iter=1)
    assert torch.allclose(result.x, a, rtol=0, atol=1e-12)  # the loss fell by 5e-9: 0.1.0 leaves x at 0


def test_rows_say_which_transformers_and_torchmin_their_protocol_ran_and_tables_mark_the_difference():
    from helpers.tables import SPECS, frame, run

    from replaceme_exp.reporting import version_marks
    from replaceme_exp.reporting.paper_tables import build_table, to_markdown
    from replaceme_exp.results.row import library_versions, protocol_library_columns

    installed = library_versions()
    official, paper = protocol_library_columns("official"), protocol_library_columns("paper")
    assert (official["transformers_version_protocol"], official["torchmin_version_protocol"]) == ("4.46.3", "0.0.2")
    assert official["transformers_off_protocol"] is (installed["transformers"] != "4.46.3")
    assert official["torchmin_off_protocol"] is False and installed["torchmin"] == "0.0.2"
    assert paper == dict.fromkeys(official, None) | {k: False for k in official if k.endswith("_off_protocol")}
    ls = dict(objective="ls", selection_metric="cosine", solver=None, solver_schedule=None)
    table = build_table(
        SPECS["structured_lts"],
        frame(
            run(1, **ls, avg_acc=0.62, ppl_lambada=21.2, rp=0.9, transformers_off_protocol=True, torchmin_off_protocol=True),
            run(2, **ls, structure="diagonal", avg_acc=0.61, ppl_lambada=89.0, rp=0.88, transformers_off_protocol=False),
        ),
    )
    labels = list(table["Setting"])
    assert labels[:2] == [f"Generic {version_marks.mark('transformers')} {version_marks.mark('torchmin')}", "Diagonal"]
    text = to_markdown(SPECS["structured_lts"], table)
    assert version_marks.note("transformers") in text and version_marks.note("torchmin") in text
    assert version_marks.NOTE not in text
