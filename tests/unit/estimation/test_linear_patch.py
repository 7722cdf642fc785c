"""LinearPatch (objective=linear_patch, selection=channel_cosine, healing=linearpatch_kl): the Hadamard
matrices, the channel scales and the patch against the paper's formula on brute-force hidden states,
the official selection, the hooked model against an explicit patch module, the distillation, the preset."""

from __future__ import annotations

import hashlib

import pytest
import torch
from helpers.jobs import job_config
from helpers.linear_patch import sylvester

from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.hadamard import ORDERS, hadamard_matrix, hadamard_order, stored_matrix
from replaceme_exp.estimation.linear_patch import ChannelScaleStatistics, check_hidden_size, patch_matrix
from replaceme_exp.healing import topk_kl_loss
from replaceme_exp.pipeline import JobSpec


def test_hadamard_matrices_are_orthonormal_and_the_official_kronecker_products():
    for k in ORDERS:
        h = stored_matrix(k)
        torch.testing.assert_close(h @ h.T, k * torch.eye(k, dtype=torch.float64), rtol=0, atol=0)
    for n in (32, 48, 576, 28 * 4, 40 * 2, 172 * 2):
        k = hadamard_order(n)
        h = hadamard_matrix(n)
        torch.testing.assert_close(h @ h.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-12)
        block = stored_matrix(k) if k > 1 else torch.ones(1, 1, dtype=torch.float64)
        # matmul_hadU(I): the butterfly over the power of two, then the stored block: (H_K x S)^T / sqrt(n)
        torch.testing.assert_close(h, torch.kron(block, sylvester(n // k)).T / n**0.5, rtol=0, atol=1e-15)
    assert hadamard_order(576) == 36 and hadamard_order(4096) == 1 and hadamard_order(3584) == 28
    for n in (88, 720, 6):  # no stored order, or the first dividing one leaves no power of two (720 = 60 x 12)
        assert hadamard_order(n) is None
        with pytest.raises(ConfigError, match=f"objective.rotate=True: needs a Hadamard matrix of the hidden size {n}"):
            check_hidden_size(n)


@pytest.mark.slow
def test_the_stored_matrices_and_the_built_ones_are_the_pinned_ones():
    """Digests taken before the matrices moved from code to ``hadamard_matrices.json``."""
    stored = hashlib.sha256(b"".join(stored_matrix(k).numpy().tobytes() for k in sorted(ORDERS)))
    assert stored.hexdigest() == "3718feb2d3120c4b3167d3ab06b954397f8bb0e4a50f28a7bbb21c580a41ec8b"
    built = hashlib.sha256(b"".join(hadamard_matrix(n).numpy().tobytes() for n in (576, 640, 768, 2048, 4096, 5120)))
    assert built.hexdigest() == "03d624c883a0b121c2f5c2e26ad4a3ba01e6e44549522778f467096af4298c87"
    assert ORDERS == (172, 156, 140, 108, 60, 52, 36, 28, 40, 20, 12)


def test_the_fused_patch_is_rotation_scaling_and_inverse_rotation_in_sequence():
    g = torch.Generator().manual_seed(0)
    scales = torch.rand(48, generator=g, dtype=torch.float64) + 0.5
    x = torch.randn(7, 48, generator=g, dtype=torch.float64)
    h = hadamard_matrix(48)
    in_sequence = ((x @ h) * scales) @ h.T  # the rotated channels scaled, then rotated back
    torch.testing.assert_close(x @ patch_matrix(scales), in_sequence)
    torch.testing.assert_close(patch_matrix(scales), patch_matrix(scales).T)  # symmetric, as the paper's P
    torch.testing.assert_close(patch_matrix(scales, rotate=False), torch.diag(scales))
    torch.testing.assert_close(patch_matrix(torch.ones(48, dtype=torch.float64)), torch.eye(48, dtype=torch.float64))


def test_topk_kl_is_the_official_kl_div_batchmean_over_the_window_length():
    g = torch.Generator().manual_seed(1)
    teacher, student = torch.randn(1, 9, 40, generator=g), torch.randn(1, 9, 40, generator=g)
    top, index = torch.topk(teacher, 5, dim=-1)
    target = torch.softmax(top, -1)
    s_log = torch.log_softmax(torch.gather(student, -1, index), dim=-1)
    official = torch.nn.KLDivLoss(reduction="batchmean")(s_log, target) / s_log.shape[1]
    mask = torch.ones(1, 9, dtype=torch.long)
    torch.testing.assert_close(topk_kl_loss(student, target, index, mask), official)


def test_the_unrotated_patch_is_named_apart_in_the_row(tmp_path):
    """rotate=false moves the number (SmolLM2 [12,20): 72.13 against 58.00): its rows must not fill the
    LinearPatch cell of a table, which picks runs by their method."""
    rotated = JobSpec.from_config(job_config(tmp_path, "experiment=linearpatch")).setting_columns()
    diagonal = JobSpec.from_config(job_config(tmp_path, "experiment=linearpatch", "objective.rotate=false"))
    assert rotated["method"] == "LinearPatch"
    assert diagonal.setting_columns()["method"] == "LinearPatch (unrotated)"


def test_channel_scales_are_kept_under_the_cache_entry_they_had_before_they_became_an_accumulator(tmp_path):
    from replaceme_exp.capture.cache import StatisticsCache
    from replaceme_exp.storage import content_key

    stats = ChannelScaleStatistics([(2, 4)], 32, torch.device("cpu"))
    ratios = torch.arange(32.0, dtype=torch.float64)
    stats.restore({"ratio_sum": ratios, "n_sequences": torch.tensor(3), "n_tokens": torch.tensor(40)})
    cache = StatisticsCache(tmp_path, "model", "data")
    cache.store(stats)
    key = {"model": "model", "data": "data", "kind": "channel_scales", "version": 1, "cut": [2, 4], "rotate": True}
    assert (tmp_path / f"channel_scales-{content_key(key, 24)}.pt").is_file()  # the file the typed get/put wrote
    again = ChannelScaleStatistics([(2, 4)], 32, torch.device("cpu"))
    assert cache.restore(again) and cache.hits == ["channel_scales"]
    found = again.result()[(2, 4)]
    assert (found.n_sequences, found.n_tokens) == (3, 40) and torch.equal(found.ratio_sum, stats.ratio_sum[(2, 4)])
    unrotated = ChannelScaleStatistics([(2, 4)], 32, torch.device("cpu"), rotate=False)
    assert not cache.restore(unrotated)  # another identity: another entry
