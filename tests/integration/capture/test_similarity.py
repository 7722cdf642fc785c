"""selection=cka / cca / pwcca: linear CKA, mean canonical correlation and projection-weighted CCA
between L_{start-1} and L_{end-1} from streamed moments, against a direct computation on explicitly
collected activations (token kernels for CKA, QR bases for CCA and PWCCA, google/svcca's pwcca.py);
their bias at few tokens per dimension; the columns every row records over held-out windows and,
with record_calibration_similarity=true, over the calibration tokens."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.explicit import explicit_blocks
from helpers.models import tiny_model
from helpers.similarity import TINY, brute_force_pwcca

from replaceme_exp.capture import TokenRule, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.similarity import MIN_TOKENS_PER_DIM, SimilarityStatistics, linear_cka_per_cut, mean_cca_per_cut, pwcca_per_cut, similarities_per_cut
from replaceme_exp.models import adapter_for
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
