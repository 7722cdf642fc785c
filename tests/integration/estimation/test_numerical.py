"""Numerical objectives on a token store, against the closed form and each other."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.explicit import explicit_blocks
from helpers.models import tiny_model
from helpers.numerical import CPU, CUT

from replaceme_exp.capture import LinearStatistics, TransformDistances, run_capture
from replaceme_exp.capture.statistics import TokenCollector
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.estimation import ridge_solve
from replaceme_exp.estimation.numerical import NumericalEstimator
from replaceme_exp.models import adapter_for


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama", 5, seed=8)
    adapter = adapter_for(model)
    calibration = batches_of(random_sequences(40, 6, 16, seed=3), 8, "left")
    heldout = batches_of(random_sequences(16, 6, 16, seed=4), 8)
    stats = LinearStatistics([CUT], 32, CPU)
    run_capture(adapter, calibration, [stats])
    return model, adapter, calibration, heldout, stats.result()[CUT]


def fill_store(adapter, batches, names, **kw):
    store = TokenStore(names, batches.n_tokens, 32, CPU, **kw)
    collector = TokenCollector(CUT, store)
    run_capture(adapter, batches, [collector])
    assert collector.offset == batches.n_tokens
    return store


def heldout_cos(adapter, heldout, transform):
    check = TransformDistances({CUT: transform})
    run_capture(adapter, heldout, [check])
    return check.result()[1]


def test_store_holds_the_non_padding_tokens_of_m_and_r(setup):
    model, adapter, *_ = setup
    sequences = random_sequences(5, 3, 9, seed=12)
    store = fill_store(adapter, batches_of(sequences, 5, "left"), ("M", "R", "Y"))
    blocks = [explicit_blocks(model, torch.tensor(s)) for s in sequences]
    m = torch.cat([b[CUT[0] - 1]["M"] for b in blocks])
    r = torch.cat([b[CUT[1] - 1]["L"] - b[CUT[0] - 1]["Y"] for b in blocks])
    assert store.tensors["M"].dtype == torch.bfloat16 and store.tensors["M"].shape == m.shape
    # Same tokens in the same order (sequence by sequence), to bfloat16 precision.
    torch.testing.assert_close(store.tensors["M"].float(), m, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(store.tensors["R"].float(), r, rtol=1e-2, atol=1e-2)


def test_a_bf16_models_target_is_formed_exactly_and_rounded_once():
    """R = L_{end-1} - (L_{start-1} - M_{start-1}) cancels (M is small next to the residual
    stream): formed in bfloat16 it is rounded twice. The store's R is the exact value of the
    model's own bf16 activations (caught here by plain forward hooks), rounded once."""
    model = tiny_model("llama", 5, seed=8).to(torch.bfloat16)
    with torch.no_grad():  # as in trained models, the MLP output is small next to the residual stream
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(0.02)
    adapter = adapter_for(model)
    batch = batches_of(random_sequences(8, 16, 16, seed=3), 8)  # one full batch, no padding
    caught = {}
    layers = model.model.layers
    hooks = [
        layers[CUT[0] - 1].register_forward_hook(
            lambda m, a, out: caught.__setitem__("prev", out[0] if isinstance(out, tuple) else out)
        ),
        layers[CUT[0] - 1].mlp.register_forward_hook(lambda m, a, out: caught.__setitem__("M", out)),
        layers[CUT[1] - 1].register_forward_hook(
            lambda m, a, out: caught.__setitem__("L", out[0] if isinstance(out, tuple) else out)
        ),
    ]
    with torch.no_grad():
        model(input_ids=batch.batches[0].input_ids, attention_mask=batch.batches[0].attention_mask)
    for hook in hooks:
        hook.remove()
    m, prev, target = (caught[k].double().reshape(-1, 32) for k in ("M", "prev", "L"))
    exact = (target - (prev - m)).to(torch.bfloat16)
    twice = caught["L"].reshape(-1, 32) - (caught["prev"] - caught["M"]).reshape(-1, 32)  # bf16 arithmetic
    assert (twice != exact).float().mean() > 0.05  # the rounding this guards against happens here
    stored = fill_store(adapter, batch, ("M", "R", "Y"))
    assert torch.equal(stored.tensors["R"], exact)
    assert torch.equal(stored.tensors["Y"], (prev - m).to(torch.bfloat16))


@pytest.mark.parametrize(
    "solver, kwargs, tolerance",
    [
        ("adam", dict(lr=3e-2, batch_tokens=256, epochs=150), 0.05),
        ("lbfgs", dict(max_iter=300, chunk_tokens=200), 0.02),
        ("trust_ncg", dict(max_iter=50, chunk_tokens=300), 0.02),
        ("newton_cg", dict(max_iter=50, chunk_tokens=300), 0.02),
    ],
)
def test_mse_lands_on_the_closed_form(setup, solver, kwargs, tolerance):
    _, adapter, calibration, _, stats = setup
    store = fill_store(adapter, calibration, ("M", "R"))
    estimator = NumericalEstimator("mse", "mse", solver=solver, **kwargs)
    t, info = estimator.fit(store, 0.0, "none", "generic", seed=0)
    # The store holds bfloat16 activations; the closed form used the float64 statistics.
    closed = ridge_solve(stats)
    assert float((t - closed).norm() / closed.norm()) < tolerance
    assert info["loss_curve"][-1] < info["loss_curve"][0]


def test_cosine_beats_ls_on_heldout_cosine_distance(setup):
    _, adapter, calibration, heldout, stats = setup
    store = fill_store(adapter, calibration, ("M", "R"))
    t_cos, info = NumericalEstimator("cosine", "cosine", lr=1e-2, batch_tokens=256, epochs=60).fit(
        store, 0.0, "none", "generic", seed=0
    )
    assert info["loss_curve"][-1] < info["loss_curve"][0]
    assert heldout_cos(adapter, heldout, t_cos) < heldout_cos(adapter, heldout, ridge_solve(stats))


@pytest.mark.parametrize("solver", ["adam", "lbfgs", "nlcg", "trust_ncg", "newton_cg"])
@pytest.mark.parametrize("loss", ["cosine", "cosine_exact", "mse"])
@pytest.mark.parametrize("structure, regularizer", [("generic", "l1"), ("diagonal", "l2"), ("generic", "none")])
def test_every_objective_and_solver_lowers_its_loss(setup, solver, loss, structure, regularizer):
    _, adapter, calibration, *_ = setup
    names = ("M", "R", "Y") if loss == "cosine_exact" else ("M", "R")
    store = fill_store(adapter, calibration, names)
    estimator = NumericalEstimator(
        loss, loss, solver=solver, lr=1e-2, batch_tokens=128, epochs=5, max_iter=5, chunk_tokens=256
    )
    t, info = estimator.fit(store, 1e-4, regularizer, structure, seed=1)
    assert info["loss_curve"][-1] < info["loss_curve"][0]
    if structure == "diagonal":
        assert torch.equal(t, torch.diag(t.diagonal()))


def test_disk_store_under_a_tiny_budget_gives_the_same_transform(setup, tmp_path, caplog):
    _, adapter, calibration, *_ = setup
    with caplog.at_level("INFO"):
        disk = fill_store(adapter, calibration, ("M", "R"), max_cpu_gb=1e-6, directory=tmp_path)
    assert disk.location == "disk" and "in disk" in caplog.text
    assert any(tmp_path.rglob("M.bin"))
    memory = fill_store(adapter, calibration, ("M", "R"))
    assert memory.location == "cpu"
    estimator = NumericalEstimator("cosine", "cosine", lr=1e-2, batch_tokens=128, epochs=3)
    t_disk, _ = estimator.fit(disk, 0.0, "none", "generic", seed=5)
    t_memory, _ = estimator.fit(memory, 0.0, "none", "generic", seed=5)
    assert torch.equal(t_disk, t_memory)
    disk.close()
    assert not any(tmp_path.rglob("M.bin"))
