"""LinearPatch (objective=linear_patch, selection=channel_cosine, healing=linearpatch_kl): the Hadamard
matrices, the channel scales and the patch against the paper's formula on brute-force hidden states,
the official selection, the hooked model against an explicit patch module, the distillation, the preset."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.explicit_modules import Bypass, TransformedBlock
from helpers.jobs import SMOKE, job_config
from helpers.models import tiny_model

from replaceme_exp.capture import run_capture
from replaceme_exp.capture.statistics import CutDistances
from replaceme_exp.config.schema import HealingConfig
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.hadamard import ORDERS, hadamard_matrix, hadamard_order, stored_matrix
from replaceme_exp.estimation.linear_patch import (
    ChannelScaleStatistics,
    LinearPatchEstimator,
    channel_cosine_distance,
    check_hidden_size,
    patch_matrix,
)
from replaceme_exp.healing import attach_trainable_transforms, teacher_targets, topk_kl_loss, train_language_model
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.surgery import prune


def value(cell):
    """A row's structured cell as Python (a JSON string in a stored row, an object in memory)."""
    return json.loads(cell) if isinstance(cell, str) else cell


def sylvester(n: int) -> torch.Tensor:
    """The +-1 Sylvester-Hadamard matrix of a power of two, by doubling."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hidden_states(model, sequences: list[list[int]]) -> list[tuple[torch.Tensor, ...]]:
    """Each sequence alone (batch 1, no padding, as the official loaders run them): its hidden states,
    ``[k]`` = the input of block ``k`` = ``L_{k-1}``, each (seq, hidden) float64."""
    out = []
    with torch.no_grad():
        for seq in sequences:
            states = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
            out.append(tuple(h[0].double() for h in states))
    return out


@pytest.mark.unit
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


@pytest.mark.unit
def test_the_stored_matrices_and_the_built_ones_are_the_pinned_ones():
    """Digests taken before the matrices moved from code to ``hadamard_matrices.json``."""
    stored = hashlib.sha256(b"".join(stored_matrix(k).numpy().tobytes() for k in sorted(ORDERS)))
    assert stored.hexdigest() == "3718feb2d3120c4b3167d3ab06b954397f8bb0e4a50f28a7bbb21c580a41ec8b"
    built = hashlib.sha256(b"".join(hadamard_matrix(n).numpy().tobytes() for n in (576, 640, 768, 2048, 4096, 5120)))
    assert built.hexdigest() == "03d624c883a0b121c2f5c2e26ad4a3ba01e6e44549522778f467096af4298c87"
    assert ORDERS == (172, 156, 140, 108, 60, 52, 36, 28, 40, 20, 12)


@pytest.mark.unit
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


@pytest.mark.integration
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])  # pre-norm; post-norm, as Gemma 3 270M
@pytest.mark.parametrize("rotate", [True, False])
def test_channel_scales_and_patch_equal_the_papers_formula_on_brute_force_hidden_states(rotate, family):
    model = tiny_model(family, 6, seed=3)
    sequences = random_sequences(7, 5, 12, seed=4)
    cut = (2, 4)
    stats = ChannelScaleStatistics([cut], 32, torch.device("cpu"), rotate=rotate)
    run_capture(adapter_for(model), batches_of(sequences, 3), [stats])  # padded batches of 3
    found = stats.result()[cut]
    h = sylvester(32) / 32**0.5 if rotate else torch.eye(32, dtype=torch.float64)
    # get_scale_params: per sample, mean_t |L_{end-1} H| / mean_t |L_{start-1} H| per channel; averaged
    ratios = [
        (states[cut[1]] @ h).abs().mean(0) / (states[cut[0]] @ h).abs().mean(0)
        for states in hidden_states(model, sequences)
    ]
    expected = torch.stack(ratios).mean(0)
    assert found.n_sequences == 7 and found.n_tokens == sum(map(len, sequences))
    torch.testing.assert_close(found.scales, expected, rtol=1e-5, atol=1e-7)
    patch = LinearPatchEstimator(rotate=rotate).estimate(found, 0.0)
    torch.testing.assert_close(patch, h @ torch.diag(expected) @ h.T, rtol=1e-5, atol=1e-7)


@pytest.mark.integration
def test_channel_cosine_selection_is_the_official_per_sequence_cosine_over_tokens():
    model = tiny_model("llama", 6, seed=5)
    sequences = random_sequences(5, 6, 14, seed=6)
    cuts = [(1, 3), (2, 4), (3, 5)]
    distances = CutDistances(cuts, sequence_distance=channel_cosine_distance)
    run_capture(adapter_for(model), batches_of(sequences, 2), [distances])
    states = hidden_states(model, sequences)
    for start, end in cuts:
        # get_pruned_layer_with_cosine: torch.cosine_similarity(act[i], act[i+n]) on (1, seq, hidden), dim=1
        sims = [torch.cosine_similarity(s[start][None].float(), s[end][None].float()).mean() for s in states]
        expected = 1.0 - float(torch.stack(sims).mean())
        assert distances.result()[(start, end)] == pytest.approx(expected, abs=1e-6)


@pytest.mark.integration
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_hooked_pruned_model_equals_a_hand_built_model_with_an_explicit_patch(family):
    model = tiny_model(family, 6, seed=7)
    sequences = random_sequences(6, 6, 10, seed=8)
    cut = (2, 4)
    stats = ChannelScaleStatistics([cut], 32, torch.device("cpu"))
    run_capture(adapter_for(model), batches_of(sequences, 3), [stats])
    patch = LinearPatchEstimator().estimate(stats.result()[cut], 0.0)
    reference = copy.deepcopy(model)
    reference.model.layers[cut[0] - 1] = TransformedBlock(reference.model.layers[cut[0] - 1], patch)
    for i in range(*cut):
        reference.model.layers[i] = Bypass()
    pruned = copy.deepcopy(model)
    prune(adapter_for(pruned), [cut], {cut: patch}, placement="separate")
    ids = torch.randint(0, 128, (2, 9))
    torch.testing.assert_close(pruned(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(pruned(ids).logits, model(ids).logits, atol=1e-3)


@pytest.mark.unit
def test_topk_kl_is_the_official_kl_div_batchmean_over_the_window_length():
    g = torch.Generator().manual_seed(1)
    teacher, student = torch.randn(1, 9, 40, generator=g), torch.randn(1, 9, 40, generator=g)
    top, index = torch.topk(teacher, 5, dim=-1)
    target = torch.softmax(top, -1)
    s_log = torch.log_softmax(torch.gather(student, -1, index), dim=-1)
    official = torch.nn.KLDivLoss(reduction="batchmean")(s_log, target) / s_log.shape[1]
    mask = torch.ones(1, 9, dtype=torch.long)
    torch.testing.assert_close(topk_kl_loss(student, target, index, mask), official)


@pytest.mark.integration
@pytest.mark.slow
def test_distilling_the_patch_lowers_its_kl_to_the_unpruned_model():
    from replaceme_exp.data.batching import TokenBatches, pad_sequences

    model = tiny_model("llama", 6, seed=9)
    sequences = random_sequences(8, 16, 16, seed=10)
    cut = (2, 4)
    stats = ChannelScaleStatistics([cut], 32, torch.device("cpu"))
    run_capture(adapter_for(model), batches_of(sequences, 4), [stats])
    patch = LinearPatchEstimator().estimate(stats.result()[cut], 0.0)
    windows = TokenBatches([pad_sequences(sequences[i : i + 2], 0, "right") for i in range(0, 8, 2)], 16)
    targets = teacher_targets(model, windows, 10)  # before surgery: the unpruned model
    adapter = adapter_for(model)
    kept = prune(adapter, [cut], {cut: patch}, placement="separate")
    trainable = attach_trainable_transforms(adapter, {cut: patch}, kept, {}, "separate")

    def kl() -> float:
        with torch.no_grad():
            losses = [
                topk_kl_loss(model(input_ids=b.input_ids).logits, p, i, b.attention_mask)
                for b, p, i in zip(windows.batches, targets.probs, targets.indices)
            ]
        return float(torch.stack(losses).mean())

    before = kl()
    cfg = HealingConfig(
        name="lt_only",
        optimizer="adamw",
        lr=3e-3,
        weight_decay=1e-4,
        lr_schedule="cosine",
        min_lr_factor=20,
        loss="topk_kl",
        kl_topk=10,
        context_length=16,
        max_steps=24,
        gradient_checkpointing=False,
        seed=0,
        log_every=4,
        data=None,
    )
    result = train_language_model(model, list(trainable.parameters.values()), windows, cfg, "lt_only", targets)
    assert result.loss_last < result.loss_first
    assert kl() < 0.9 * before
    assert not torch.equal(trainable.parameters[kept.index(cut[0] - 1)].detach().double(), patch)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_linearpatch_preset_runs_end_to_end_and_saves_what_reloads_it(tmp_path):
    from replaceme_exp.runtime.export import export_checkpoint
    from replaceme_exp.surgery import load_pruned

    row = run_recorded(job_config(tmp_path, "experiment=linearpatch", "save_model=transform"))
    assert row["status"] == "finished", row["error"]
    assert row["method"] == "LinearPatch" and row["objective"] == "linear_patch"
    assert row["selection_metric"] == "channel_cosine" and row["lt_placement"] == "separate"
    assert row["plain_checkpoint"] is False
    num_layers = row["num_layers"]
    assert all(end < num_layers for _, end, _ in value(row["candidate_distances"]))  # the official candidates
    assert value(row["patch_sequences"]) == {"-".join(map(str, value(row["cuts"])[0])): 24}
    assert value(row["stage_seconds"])["capture (channel scales)"] > 0 and row["time_capture_s"] > 0
    target = export_checkpoint(tmp_path, row["config_hash"])
    assert (Path(target) / "separate_transforms.safetensors").is_file()
    reloaded = load_pruned(target).eval()
    ids = torch.randint(0, 1000, (1, 12))
    plain = type(reloaded).from_pretrained(target).eval()  # without its patch: another model
    assert not torch.allclose(reloaded(ids).logits, plain(ids).logits, atol=1e-4)
    # another results store, the same statistics cache: the channel scales are read back, the same patch
    again = run_recorded(
        compose_config(
            [*SMOKE, "experiment=linearpatch", f"results_dir={tmp_path}/again", f"capture.cache_dir={tmp_path}/stats"]
        )
    )
    assert "channel_scales" in value(again["cached_stages"]) and again["ppl_heldout"] == row["ppl_heldout"]


@pytest.mark.e2e
@pytest.mark.slow
def test_the_distillation_preset_trains_the_patch_against_the_unpruned_model(tmp_path):
    row = run_recorded(
        job_config(
            tmp_path,
            "experiment=linearpatch_distill",
            "healing/data=pydoc",
            "healing.max_steps=6",
            "healing.context_length=64",
            "healing.log_every=2",
            "save_model=false",
        )
    )
    assert row["status"] == "finished", row["error"]
    assert row["method"] == "LinearPatch + LT healing (topk_kl)"
    settings = value(row["healing_settings"])
    assert settings["loss"] == "topk_kl" and settings["optimizer"] == "adamw" and settings["lr_schedule"] == "cosine"
    assert row["healing_teacher_gb"] > 0 and row["healing_steps"] == 6
    change = value(row["healing_transform_change"])  # the patch moved (its loss falls: the integration test)
    assert list(change) == ["-".join(map(str, value(row["cuts"])[0]))] and 0 < next(iter(change.values())) < 0.1


@pytest.mark.unit
def test_the_unrotated_patch_is_named_apart_in_the_row(tmp_path):
    """rotate=false moves the number (SmolLM2 [12,20): 72.13 against 58.00): its rows must not fill the
    LinearPatch cell of a table, which picks runs by their method."""
    rotated = JobSpec.from_config(job_config(tmp_path, "experiment=linearpatch")).setting_columns()
    diagonal = JobSpec.from_config(job_config(tmp_path, "experiment=linearpatch", "objective.rotate=false"))
    assert rotated["method"] == "LinearPatch"
    assert diagonal.setting_columns()["method"] == "LinearPatch (unrotated)"


@pytest.mark.unit
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


@pytest.mark.integration
def test_a_declared_statistic_over_no_token_is_refused_in_one_line_naming_the_calibration(tmp_path):
    from replaceme_exp.capture.cache import StatisticsCache
    from replaceme_exp.estimation.fitting import fit_transforms

    spec = JobSpec.from_config(compose_config(["experiment=linearpatch"]))
    empty = ChannelScaleStatistics([(2, 4)], 32, torch.device("cpu"))  # nothing accumulated: as if no sequence
    cache = StatisticsCache(tmp_path, "model", "data")
    cache.store(empty)
    model, batches = tiny_model("llama", 6, seed=3), batches_of(random_sequences(4, 5, 8, seed=4), 2)
    with pytest.raises(ConfigError, match=r"calibration\.n_samples=4: leaves no calibration token for cut \[2, 4\]"):
        fit_transforms(adapter_for(model), batches, LinearPatchEstimator(), [(2, 4)], {}, spec.fit_request(), cache)
