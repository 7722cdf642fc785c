"""selection=cka / selection=cca: linear CKA and mean canonical correlation between L_{start-1}
and L_{end-1} from streamed moments, against a direct computation on explicitly collected
activations (token kernels for CKA, QR bases for CCA)."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config, validate_config
from helpers.explicit import explicit_blocks
from helpers.models import tiny_model

from replaceme_exp.capture import TokenRule, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.similarity import (
    Moments,
    SimilarityStatistics,
    linear_cka,
    linear_cka_per_cut,
    mean_cca,
    mean_cca_per_cut,
)
from replaceme_exp.config.validate import typed_config
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline.rules import check_selection
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


def moments_of(x: torch.Tensor, y: torch.Tensor) -> Moments:
    return Moments(x.shape[0], x.sum(0), y.sum(0), x.T @ x, y.T @ y, x.T @ y)


@pytest.mark.integration
@pytest.mark.parametrize("side", ["right", "left"])
def test_streamed_cka_and_cca_equal_a_direct_computation_on_explicit_activations(model, side):
    sequences = random_sequences(9, 6, 16, seed=3)  # about 100 tokens > hidden 32: CCA is defined
    statistics = SimilarityStatistics(CUTS, 32, torch.device("cpu"))
    run_capture(adapter_for(model), batches_of(sequences, 4, side), [statistics])
    outputs = explicit_outputs(model, sequences)
    cka, cca = linear_cka_per_cut(statistics), mean_cca_per_cut(statistics)
    for start, end in CUTS:
        x, y = outputs[start - 1], outputs[end - 1]
        assert cka[(start, end)] == pytest.approx(kernel_cka(x, y), rel=1e-5)
        assert cca[(start, end)] == pytest.approx(qr_cca(x, y), rel=1e-4)
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
    distances, _ = selection_distances(request, adapter_for(model), batches, cache, CUTS, needs_stats=False)
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


TINY = [
    "model=tiny_llama",
    "calibration.n_samples=16",
    "calibration.seq_len=32",
    "eval.seq_len=32",
    "eval.max_windows=4",
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
    "save_model=false",
    "n_prune=2",
]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("metric", ["cka", "cca"])
def test_a_job_selects_the_cut_of_largest_similarity_and_records_it(tmp_path, metric):
    overrides = TINY + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", f"selection={metric}"]
    row = run_recorded(compose_config(overrides))
    assert row["status"] == "finished" and row["selection_metric"] == metric
    distances = {(s, e): d for s, e, d in row["candidate_distances"]}
    assert len(distances) == 4 and all(0.0 <= d <= 1.0 for d in distances.values())
    best = min(distances, key=lambda c: (distances[c], c))
    assert row["cuts"] == [list(best)] and row["selection_distance"] == pytest.approx(distances[best])
    for column in ("linear_cka_before", "mean_cca_before"):
        assert 0.0 < row[column] <= 1.0
    again = run_recorded(compose_config(overrides + ["eval.max_windows=3"]))  # same calibration data
    assert "selection" in again["cached_stages"] and again["candidate_distances"] == row["candidate_distances"]


@pytest.mark.unit
@pytest.mark.parametrize("metric", ["cka", "cca"])
def test_last_token_similarity_is_refused_in_one_line(tmp_path, metric):
    cfg = compose_config(TINY + [f"results_dir={tmp_path}", f"selection={metric}", "selection.tokens=last"])
    with pytest.raises(ConfigError, match=rf"^selection.tokens='last': selection.metric={metric} is computed"):
        validate_config(cfg)
    with pytest.raises(ConfigError):
        check_selection(typed_config(cfg))
