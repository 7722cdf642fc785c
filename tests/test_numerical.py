"""Numerical objectives on a token store, against the closed form and each other."""

from __future__ import annotations

import pytest
import torch
from conftest import batches_of, random_sequences, tiny_model
from explicit import explicit_blocks

from replaceme_exp.capture import LinearStatistics, TransformDistances, run_capture
from replaceme_exp.capture.statistics import TokenCollector
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.estimation import ridge_solve
from replaceme_exp.estimation.numerical import NumericalEstimator
from replaceme_exp.models import adapter_for

CUT = (2, 4)
CPU = torch.device("cpu")


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


@pytest.mark.parametrize(
    "solver, kwargs, tolerance",
    [
        ("adam", dict(lr=3e-2, batch_tokens=256, epochs=150), 0.05),
        ("lbfgs", dict(max_iter=300, chunk_tokens=200), 0.02),
        ("trust_ncg", dict(max_iter=50, chunk_tokens=300), 0.02),
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


@pytest.mark.parametrize("solver", ["adam", "lbfgs", "nlcg", "trust_ncg"])
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


def test_masking_is_reproducible_from_the_seed(setup):
    _, adapter, calibration, *_ = setup
    store = fill_store(adapter, calibration, ("M", "R"))
    estimator = NumericalEstimator("cosine", "cosine", lr=1e-2, batch_tokens=128, epochs=2)
    a, _ = estimator.fit(store, 0.0, "none", "generic", seed=3, mask_ratio=0.3)
    b, _ = estimator.fit(store, 0.0, "none", "generic", seed=3, mask_ratio=0.3)
    c, _ = estimator.fit(store, 0.0, "none", "generic", seed=4, mask_ratio=0.3)
    unmasked, _ = estimator.fit(store, 0.0, "none", "generic", seed=3)
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, unmasked)
    with pytest.raises(Exception, match="mask_ratio=0.3: token masking needs mini-batches"):
        NumericalEstimator("cosine", "cosine", solver="lbfgs").fit(store, 0.0, "none", "generic", 0, mask_ratio=0.3)
