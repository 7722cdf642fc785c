"""selection=cka / cca / pwcca: linear CKA, mean canonical correlation and projection-weighted CCA
between L_{start-1} and L_{end-1} from streamed moments, against a direct computation on explicitly
collected activations (token kernels for CKA, QR bases for CCA and PWCCA, google/svcca's pwcca.py);
their bias at few tokens per dimension; the columns every row records over held-out windows and,
with record_calibration_similarity=true, over the calibration tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config, config_hash, validate_config
from helpers.explicit import explicit_blocks
from helpers.models import tiny_model

from replaceme_exp.capture import TokenRule, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.similarity import (
    MIN_TOKENS_PER_DIM,
    Moments,
    SimilarityStatistics,
    linear_cka,
    linear_cka_per_cut,
    mean_cca,
    mean_cca_per_cut,
    pwcca,
    pwcca_per_cut,
    similarities_per_cut,
    undersampled,
)
from replaceme_exp.config.validate import typed_config
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline.rules import check_selection
from replaceme_exp.pipeline.spec import estimator_class
from replaceme_exp.runtime import run_recorded
from replaceme_exp.selection.metrics import METRICS
from replaceme_exp.selection.passes import SelectionRequest, selection_distances

NUM_LAYERS = 6
CUTS = [(1, 3), (2, 4), (3, 5), (1, 6)]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", NUM_LAYERS)


def explicit_outputs(model, sequences) -> list[torch.Tensor]:
    """L_k of every block over all tokens of all (unpadded) sequences: [(n_tokens, d)] float64."""
    per_block = [[] for _ in range(NUM_LAYERS)]
    for seq in sequences:
        for k, block in enumerate(explicit_blocks(model, torch.tensor(seq))):
            per_block[k].append(block["L"].double())
    return [torch.cat(rows) for rows in per_block]


def kernel_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA from the (n, n) token kernels: HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))."""
    n = x.shape[0]
    h = torch.eye(n, dtype=x.dtype) - 1.0 / n
    k, l_ = h @ x @ x.T @ h, h @ y @ y.T @ h
    return float((k * l_).sum() / (k.norm() * l_.norm()))


def qr_cca(x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean canonical correlation: singular values of Qx^T Qy for orthonormal bases of the
    centred representations."""
    qx, _ = torch.linalg.qr(x - x.mean(0))
    qy, _ = torch.linalg.qr(y - y.mean(0))
    return float(torch.linalg.svdvals(qx.T @ qy).mean())


def brute_force_pwcca(x: torch.Tensor, y: torch.Tensor) -> float:
    """PWCCA on explicit activations (n, d) as google/svcca's pwcca.py computes it, with the paper's
    canonical variates: orthonormal bases of the centred representations (QR), the SVD of
    ``Qx^T Qy`` (correlations and X's variates ``Qx U``), the variates made orthonormal by QR (as
    the reference does), ``alpha_i = sum_j |<h_i, x_j>|`` over X's raw coordinates."""
    x, y = x.double().numpy(), y.double().numpy()
    qx, _ = np.linalg.qr(x - x.mean(0))
    qy, _ = np.linalg.qr(y - y.mean(0))
    u, rho, _ = np.linalg.svd(qx.T @ qy)
    variates, _ = np.linalg.qr(qx @ u)
    alpha = np.abs(variates.T @ x).sum(1)
    return float((alpha / alpha.sum() * rho).sum())


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


@pytest.mark.integration
@pytest.mark.parametrize("side", ["right", "left"])
def test_streamed_cka_and_cca_equal_a_direct_computation_on_explicit_activations(model, side):
    sequences = random_sequences(9, 6, 16, seed=3)  # about 100 tokens > hidden 32: CCA is defined
    statistics = SimilarityStatistics(CUTS, 32, torch.device("cpu"))
    run_capture(adapter_for(model), batches_of(sequences, 4, side), [statistics])
    outputs = explicit_outputs(model, sequences)
    cka, cca, pw = linear_cka_per_cut(statistics), mean_cca_per_cut(statistics), pwcca_per_cut(statistics)
    together = similarities_per_cut(statistics)
    for start, end in CUTS:
        x, y = outputs[start - 1], outputs[end - 1]
        assert cka[(start, end)] == pytest.approx(kernel_cka(x, y), rel=1e-5)
        assert cca[(start, end)] == pytest.approx(qr_cca(x, y), rel=1e-4)
        assert pw[(start, end)] == pytest.approx(brute_force_pwcca(x, y), rel=1e-4)
        found = together[(start, end)]
        one_svd = (found.linear_cka, found.mean_cca, found.pwcca)
        assert one_svd == pytest.approx((cka[(start, end)], cca[(start, end)], pw[(start, end)]), abs=1e-12)
        assert found.n_tokens == x.shape[0] == statistics.n_tokens
    assert len({round(v, 6) for v in pw.values()}) == len(CUTS)  # the cuts really differ
    # the distances a cka selection compares (1 - similarity), uncached
    request = SelectionRequest(
        cuts=None,
        n_prune=2,
        num_lts=1,
        merge_consecutive=True,
        metric=METRICS.get("cka"),
        tokens="all",
        alpha=0.0,
        placement="fused",
        rule=TokenRule(),
        precision="float64",
    )
    cache = StatisticsCache("unused", "model", "data", enabled=False)
    batches = batches_of(sequences, 4, side)
    distances, _, _ = selection_distances(request, adapter_for(model), batches, cache, CUTS, needs_stats=False)
    assert distances == {cut: pytest.approx(1.0 - value) for cut, value in cka.items()}
    assert len({round(v, 6) for v in cka.values()}) == len(CUTS)  # the cuts really differ


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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


TINY = [
    "model=tiny_llama",
    "calibration.n_samples=16",
    "calibration.seq_len=32",
    "eval.seq_len=32",
    "eval.max_windows=4",
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
    "eval=heldout",  # held-out perplexity only (eval=quick would add lm-eval's offline tasks)
    "save_model=false",
    "n_prune=2",
]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("metric", ["cka", "cca", "pwcca"])
def test_a_job_selects_the_cut_of_largest_similarity_and_records_it(tmp_path, metric):
    overrides = TINY + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", f"selection={metric}"]
    row = run_recorded(compose_config(overrides))
    assert row["status"] == "finished" and row["selection_metric"] == metric
    distances = {(s, e): d for s, e, d in row["candidate_distances"]}
    assert len(distances) == 4 and all(0.0 <= d <= 1.0 for d in distances.values())
    best = min(distances, key=lambda c: (distances[c], c))
    assert row["cuts"] == [list(best)] and row["selection_distance"] == pytest.approx(distances[best])
    for column in ("linear_cka_before", "mean_cca_before", "pwcca_before"):
        assert 0.0 < row[column] <= 1.0
    assert row["similarity_tokens_before"] == 4 * 32  # eval.max_windows x eval.seq_len
    assert row["similarity_undersampled_before"] is True  # 128 tokens for d = 64
    assert "pwcca_calibration" not in row  # record_calibration_similarity is off
    again = run_recorded(compose_config(overrides + ["eval.max_windows=3"]))  # same calibration data
    assert "selection" in again["cached_stages"] and again["candidate_distances"] == row["candidate_distances"]


@pytest.mark.unit
@pytest.mark.parametrize("metric", ["cka", "cca", "pwcca"])
def test_last_token_similarity_is_refused_in_one_line(tmp_path, metric):
    cfg = compose_config(TINY + [f"results_dir={tmp_path}", f"selection={metric}", "selection.tokens=last"])
    with pytest.raises(ConfigError, match=rf"^selection.tokens='last': selection.metric={metric} is computed"):
        validate_config(cfg)
    typed = typed_config(cfg)
    with pytest.raises(ConfigError):
        check_selection(typed, estimator_class(typed.objective).requirements(typed.objective))


@pytest.mark.unit
def test_record_calibration_similarity_enters_the_hash_only_when_on(tmp_path):
    base = TINY + [f"results_dir={tmp_path}"]
    off = config_hash(compose_config(base))
    assert config_hash(compose_config(base + ["record_calibration_similarity=false"])) == off
    assert config_hash(compose_config(base + ["record_calibration_similarity=true"])) != off


@pytest.mark.integration
@pytest.mark.slow
def test_calibration_similarity_is_recorded_over_the_calibration_tokens_and_cached(tmp_path):
    overrides = TINY + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", "calibration.n_samples=128"]
    on = ["record_calibration_similarity=true"]
    row = run_recorded(compose_config(overrides + on + ["selection=pwcca"]))
    # the selection pass took every candidate's PWCCA over the same tokens, the similarity pass the chosen cut's
    assert row["pwcca_calibration"] == pytest.approx(1.0 - row["selection_distance"], abs=1e-12)
    assert 0.0 < row["linear_cka_calibration"] <= 1.0 and 0.0 < row["mean_cca_calibration"] <= 1.0
    assert row["similarity_tokens_calibration"] == row["n_calib_tokens"] >= MIN_TOKENS_PER_DIM * 64  # d = 64
    assert row["similarity_undersampled_calibration"] is False and row["similarity_undersampled_before"] is True
    # the same cut given, another objective: the similarities come from the cache
    cut = row["cuts"][0]
    again = run_recorded(compose_config(overrides + on + ["objective=identity", f"cuts=[[{cut[0]},{cut[1]}]]"]))
    assert "calibration_similarity" in again["cached_stages"]
    columns = ("linear_cka", "mean_cca", "pwcca", "similarity_tokens", "similarity_undersampled")
    assert all(again[f"{c}_calibration"] == row[f"{c}_calibration"] for c in columns)
