"""LinearPatch (objective=linear_patch, selection=channel_cosine, healing=linearpatch_kl): the Hadamard
matrices, the channel scales and the patch against the paper's formula on brute-force hidden states,
the official selection, the hooked model against an explicit patch module, the distillation, the preset."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.explicit_modules import Bypass, TransformedBlock
from helpers.linear_patch import sylvester
from helpers.models import tiny_model

from replaceme_exp.capture import run_capture
from replaceme_exp.capture.statistics import CutDistances
from replaceme_exp.config.schema import HealingConfig
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.linear_patch import ChannelScaleStatistics, LinearPatchEstimator, channel_cosine_distance
from replaceme_exp.healing import attach_trainable_transforms, teacher_targets, topk_kl_loss, train_language_model
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.surgery import prune


def hidden_states(model, sequences: list[list[int]]) -> list[tuple[torch.Tensor, ...]]:
    """Each sequence alone (batch 1, no padding, as the official loaders run them): its hidden states,
    ``[k]`` = the input of block ``k`` = ``L_{k-1}``, each (seq, hidden) float64."""
    out = []
    with torch.no_grad():
        for seq in sequences:
            states = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
            out.append(tuple(h[0].double() for h in states))
    return out


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
