"""Closed-form LS and ridge against torch.linalg.lstsq on explicitly collected activations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.explicit import explicit_blocks
from helpers.models import tiny_model

from replaceme_exp.capture import LinearStatistics, run_capture
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation import LeastSquaresEstimator, ridge_solve
from replaceme_exp.estimation.least_squares import residual_sq
from replaceme_exp.models import adapter_for


CUT = (2, 4)


@pytest.fixture(scope="module")
def captured():
    model = tiny_model("llama", 5, seed=1)
    sequences = random_sequences(12, 4, 16, seed=5)
    stats = LinearStatistics([CUT], 32, torch.device("cpu"))
    run_capture(adapter_for(model), batches_of(sequences, 5), [stats])
    m_rows, r_rows = [], []
    for seq in sequences:
        blocks = explicit_blocks(model, torch.tensor(seq))
        m_rows.append(blocks[CUT[0] - 1]["M"])
        r_rows.append(blocks[CUT[1] - 1]["L"] - blocks[CUT[0] - 1]["Y"])
    return stats.result()[CUT], torch.cat(m_rows).double(), torch.cat(r_rows).double()


def test_ls_equals_lstsq_on_activations(captured):
    stats, m, r = captured
    expected = torch.linalg.lstsq(m, r, driver="gelsd").solution
    t = ridge_solve(stats, 0.0)
    torch.testing.assert_close(t, expected, rtol=1e-5, atol=1e-6)
    assert residual_sq(stats, t) == pytest.approx(float((m @ t - r).pow(2).sum()), rel=1e-6)
    assert residual_sq(stats, t) < residual_sq(stats, torch.eye(32, dtype=torch.float64))


@pytest.mark.parametrize("alpha", [0.1, 10.0])
def test_ridge_equals_its_normal_equations(captured, alpha):
    stats, m, r = captured
    a, b = m.numpy(), r.numpy()
    # Independent route: least squares on the augmented system [M; sqrt(alpha) I] T = [R; 0].
    augmented = np.vstack([a, np.sqrt(alpha) * np.eye(32)])
    target = np.vstack([b, np.zeros((32, 32))])
    expected = np.linalg.lstsq(augmented, target, rcond=None)[0]
    # Activations come from a float32 model through two code paths: agree to float32 precision.
    np.testing.assert_allclose(ridge_solve(stats, alpha).numpy(), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        ridge_solve(stats, alpha).numpy(), np.linalg.solve(a.T @ a + alpha * np.eye(32), a.T @ b), rtol=1e-4, atol=1e-5
    )


def test_diagonal_closed_form_is_the_per_coordinate_least_squares(captured):
    stats, m, r = captured
    for alpha in (0.0, 3.0):
        t = LeastSquaresEstimator().estimate(stats, alpha, "diagonal")
        assert torch.equal(t, torch.diag(t.diagonal()))
        # Independent: one scalar least-squares problem per coordinate, min_t ||m_i t - r_i||^2 + alpha t^2.
        expected = torch.stack(
            [
                torch.linalg.lstsq(
                    torch.cat([m[:, i : i + 1], torch.tensor([[alpha**0.5]], dtype=torch.float64)]),
                    torch.cat([r[:, i : i + 1], torch.zeros(1, 1, dtype=torch.float64)]),
                ).solution[0, 0]
                for i in range(32)
            ]
        )
        torch.testing.assert_close(t.diagonal(), expected, rtol=1e-4, atol=1e-6)
    best = residual_sq(stats, LeastSquaresEstimator().estimate(stats, 0.0, "diagonal"))
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        candidate = torch.diag(
            LeastSquaresEstimator().estimate(stats, 0.0, "diagonal").diagonal()
            + 0.1 * torch.randn(32, generator=g, dtype=torch.float64)
        )
        assert residual_sq(stats, candidate) >= best
    assert residual_sq(stats, LeastSquaresEstimator().estimate(stats, 0.0)) <= best  # generic is no worse


def test_orthonormal_closed_form_is_the_procrustes_solution(captured):
    stats, m, r = captured
    t = LeastSquaresEstimator().estimate(stats, 0.0, "orthonormal")
    torch.testing.assert_close(t.T @ t, torch.eye(32, dtype=torch.float64), rtol=0, atol=1e-10)
    u, _, vh = torch.linalg.svd(m.T @ r)  # from the activations themselves
    torch.testing.assert_close(t, u @ vh, rtol=1e-4, atol=1e-5)
    best = residual_sq(stats, t)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        q, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=torch.float64))
        assert residual_sq(stats, q) >= best
    assert residual_sq(stats, torch.eye(32, dtype=torch.float64)) >= best


def test_unknown_structure_names_the_key(captured):
    with pytest.raises(ConfigError, match="structure='banded'"):
        LeastSquaresEstimator().estimate(captured[0], 0.0, "banded")


def test_separate_placement_statistics_regress_the_block_output(captured):
    model = tiny_model("llama", 5, seed=1)
    sequences = random_sequences(12, 4, 16, seed=5)
    stats = LinearStatistics([CUT], 32, torch.device("cpu"), placement="separate")
    run_capture(adapter_for(model), batches_of(sequences, 5), [stats])
    x, y = [], []
    for seq in sequences:
        blocks = explicit_blocks(model, torch.tensor(seq))
        x.append(blocks[CUT[0] - 1]["L"])
        y.append(blocks[CUT[1] - 1]["L"])
    expected = torch.linalg.lstsq(torch.cat(x).double(), torch.cat(y).double()).solution
    torch.testing.assert_close(ridge_solve(stats.result()[CUT]), expected, rtol=1e-4, atol=1e-5)


def test_the_fit_captures_the_statistics_it_lacks_and_solves_on_the_explicit_activations(captured):
    """A sequential cut's statistics are no longer captured by the job (issue 51): the fit captures the
    LS statistics it is not given, and its T is lstsq's on the explicit activations of the same tokens."""
    from helpers.config import compose_config

    from replaceme_exp.estimation.fitting import fit_transforms
    from replaceme_exp.pipeline.spec import JobSpec

    _, m, r = captured
    model = tiny_model("llama", 5, seed=1)
    batches = batches_of(random_sequences(12, 4, 16, seed=5), 5)
    request = JobSpec.from_config(compose_config(["objective=ls", "alpha=0"])).fit_request()
    fit = fit_transforms(adapter_for(model), batches, LeastSquaresEstimator(), [CUT], {}, request)
    expected = torch.linalg.lstsq(m, r, driver="gelsd").solution
    torch.testing.assert_close(fit.transforms[CUT], expected, rtol=1e-5, atol=1e-6)
    assert fit.fit_tokens["2-4"] == m.shape[0]
