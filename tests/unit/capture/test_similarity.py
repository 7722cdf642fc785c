"""selection=cka / cca / pwcca: linear CKA, mean canonical correlation and projection-weighted CCA
between L_{start-1} and L_{end-1} from streamed moments, against a direct computation on explicitly
collected activations (token kernels for CKA, QR bases for CCA and PWCCA, google/svcca's pwcca.py);
their bias at few tokens per dimension; the columns every row records over held-out windows and,
with record_calibration_similarity=true, over the calibration tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.config import compose_config, config_hash, validate_config
from helpers.similarity import TINY, brute_force_pwcca

from replaceme_exp.capture.similarity import MIN_TOKENS_PER_DIM, Moments, linear_cka, mean_cca, pwcca, undersampled
from replaceme_exp.config.validate import typed_config
from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.rules import check_selection
from replaceme_exp.pipeline.spec import estimator_class


def svcca_pwcca(x: np.ndarray, y: np.ndarray) -> float:
    """google/svcca's ``compute_pwcca(acts1, acts2, epsilon=0)`` (cca_core + pwcca.py) transcribed
    for (n, d) activations: covariances scaled by their largest entry, ``svd(Sxx^-1/2 Sxy Syy^-1/2)``,
    directions ``u_i^T (x - mean) + mean`` (no ``Sxx^-1/2``: the canonical variates only when X is
    white), made orthonormal by QR, ``alpha = sum_j |<p_i, x_j>|``."""
    d = x.shape[1]
    cov = np.cov(x.T, y.T)
    sxx, sxy, syy = cov[:d, :d], cov[:d, d:], cov[d:, d:]
    xmax, ymax = np.abs(sxx).max(), np.abs(syy).max()
    sxx, syy, sxy = sxx / xmax, syy / ymax, sxy / np.sqrt(xmax * ymax)

    def inverse_sqrt(s):
        w, v = np.linalg.eigh(np.linalg.pinv(s))
        return v @ np.diag(np.sqrt(w)) @ v.T

    u, rho, _ = np.linalg.svd(inverse_sqrt(sxx) @ sxy @ inverse_sqrt(syy))
    means = x.mean(0)[:, None]
    directions = u.T @ (x.T - means) + means
    p, _ = np.linalg.qr(directions.T)
    alpha = np.abs(p.T @ x).sum(1)
    return float((alpha / alpha.sum() * np.abs(rho)).sum())


def moments_of(x: torch.Tensor, y: torch.Tensor) -> Moments:
    return Moments(x.shape[0], x.sum(0), y.sum(0), x.T @ x, y.T @ y, x.T @ y)


def test_cka_and_cca_see_through_rotation_and_scale_and_tell_unrelated_data_apart():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=g, dtype=torch.float64) * torch.linspace(0.5, 3.0, 8, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    rotated = 2.5 * x @ q + 1.0  # CKA: invariant to rotation, scale, shift
    mixing = torch.eye(8, dtype=torch.float64) + 0.3 * torch.randn(8, 8, generator=g, dtype=torch.float64)
    mixed = x @ mixing  # CCA: invariant to any invertible map (this one well conditioned: the ridge stays small)
    noise = torch.randn(400, 8, generator=g, dtype=torch.float64)
    assert linear_cka(moments_of(x, rotated)) == pytest.approx(1.0, abs=1e-9)
    assert mean_cca(moments_of(x, mixed)) == pytest.approx(1.0, abs=1e-4)  # the ridge costs ~1e-5 here
    assert linear_cka(moments_of(x, noise)) < 0.1 and mean_cca(moments_of(x, noise)) < 0.2
    assert linear_cka(moments_of(x, mixed)) < 1.0 - 1e-3  # CKA is not invariant to a general linear map


def test_pwcca_from_moments_equals_a_brute_force_on_explicit_activations():
    g = torch.Generator().manual_seed(1)
    n, d = 500, 16
    scales = torch.logspace(-1, 1, d, dtype=torch.float64)  # anisotropic, with a mean: X is far from white
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * scales + 3.0
    mixing = torch.randn(d, d, generator=g, dtype=torch.float64)
    y = 0.3 * x @ mixing + torch.randn(n, d, generator=g, dtype=torch.float64)
    expected = brute_force_pwcca(x, y)
    assert pwcca(moments_of(x, y), ridge=0.0) == pytest.approx(expected, abs=1e-9)
    assert pwcca(moments_of(x, y)) == pytest.approx(expected, abs=1e-4)  # the default ridge (1e-6 trace / d)
    assert pwcca(moments_of(x, y)) != pytest.approx(mean_cca(moments_of(x, y)), abs=0.05)  # the weights act
    assert pwcca(moments_of(x, y)) != pytest.approx(pwcca(moments_of(y, x)), abs=0.01)  # weights from X: not symmetric


def test_pwcca_equals_the_reference_code_where_its_directions_are_the_canonical_variates():
    """google/svcca's pwcca.py weighs ``u_i^T (X - mean)``, without ``Sxx^-1/2``: the canonical
    variates when X is white and centred (equal here), other vectors elsewhere (different)."""
    rng = np.random.default_rng(0)
    n, d = 500, 16
    x = rng.standard_normal((n, d))
    x, _ = np.linalg.qr(x - x.mean(0))
    x = 5.0 * x  # centred, X^T X = 25 I
    y = 0.3 * x @ rng.standard_normal((d, d)) + 0.2 * rng.standard_normal((n, d))
    white = moments_of(torch.from_numpy(x), torch.from_numpy(y))
    assert pwcca(white, ridge=0.0) == pytest.approx(svcca_pwcca(x, y), abs=1e-9)
    x = x * np.logspace(-1, 1, d) + 3.0
    coloured = moments_of(torch.from_numpy(x), torch.from_numpy(y))
    assert pwcca(coloured, ridge=0.0) == pytest.approx(brute_force_pwcca(torch.from_numpy(x), torch.from_numpy(y)))
    assert abs(pwcca(coloured, ridge=0.0) - svcca_pwcca(x, y)) > 1e-3


def test_pwcca_is_one_for_the_same_representation_up_to_rotation_and_small_for_independent_ones():
    g = torch.Generator().manual_seed(2)
    n, d = 2000, 8
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(0.5, 3.0, d, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    noise = torch.randn(n, d, generator=g, dtype=torch.float64)
    assert pwcca(moments_of(x, x)) == pytest.approx(1.0, abs=1e-5)
    assert pwcca(moments_of(x, 2.5 * x @ q + 1.0)) == pytest.approx(1.0, abs=1e-5)
    assert pwcca(moments_of(x, noise)) < 0.1  # 0.85 sqrt(d / n) = 0.05 expected
    assert pwcca(moments_of(torch.zeros(n, d, dtype=torch.float64), noise)) == 0.0  # no variance: no weight


def test_cca_of_independent_representations_is_biased_upward_at_few_tokens_per_dimension():
    """Two independent Gaussians in d = 64 (docs/guides/selection-cka-cca.md): mean CCA and PWCCA
    should be 0, are about 0.85 sqrt(d / n), and MIN_TOKENS_PER_DIM flags where that is large."""
    d = 64
    found = {}
    for per_dim in (2, 10, 50):
        g = torch.Generator().manual_seed(per_dim)
        x, y = (torch.randn(per_dim * d, d, generator=g, dtype=torch.float64) for _ in range(2))
        found[per_dim] = (mean_cca(moments_of(x, y)), pwcca(moments_of(x, y)))
    assert found[2][0] == pytest.approx(0.64, abs=0.03) and found[2][1] == pytest.approx(0.64, abs=0.03)
    assert found[10][0] == pytest.approx(0.27, abs=0.02) and found[50][0] == pytest.approx(0.12, abs=0.01)
    assert found[50][1] == pytest.approx(0.12, abs=0.01)
    assert undersampled(10 * d, d) and undersampled(MIN_TOKENS_PER_DIM * d - 1, d)
    assert not undersampled(MIN_TOKENS_PER_DIM * d, d)
    assert undersampled(8192, 4096)  # the paper template's held-out windows on Llama 3 8B


@pytest.mark.parametrize("metric", ["cka", "cca", "pwcca"])
def test_last_token_similarity_is_refused_in_one_line(tmp_path, metric):
    cfg = compose_config(TINY + [f"results_dir={tmp_path}", f"selection={metric}", "selection.tokens=last"])
    with pytest.raises(ConfigError, match=rf"^selection.tokens='last': selection.metric={metric} is computed"):
        validate_config(cfg)
    typed = typed_config(cfg)
    with pytest.raises(ConfigError):
        check_selection(typed, estimator_class(typed.objective).requirements(typed.objective))


def test_record_calibration_similarity_enters_the_hash_only_when_on(tmp_path):
    base = TINY + [f"results_dir={tmp_path}"]
    off = config_hash(compose_config(base))
    assert config_hash(compose_config(base + ["record_calibration_similarity=false"])) == off
    assert config_hash(compose_config(base + ["record_calibration_similarity=true"])) != off
