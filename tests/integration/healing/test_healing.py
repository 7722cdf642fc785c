"""Healing: lt_only trains T itself and fuses it back, full_model trains every weight, lora (peft)
merges into a plain model; the job records the healing stage and the perplexity before and after."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.models import tiny_model
from torch import nn

from replaceme_exp.config import schema
from replaceme_exp.config.validate import build_option
from replaceme_exp.data.batching import TokenBatch, TokenBatches
from replaceme_exp.errors import ConfigError
from replaceme_exp.healing import attach_trainable_transforms, fusion_weights, heal, with_lora_adapters
from replaceme_exp.models import adapter_for
from replaceme_exp.surgery import prune


CUT = (2, 4)


HIDDEN = 32


def healing_cfg(name: str, **overrides) -> schema.HealingConfig:
    cfg = {
        "name": name,
        "optimizer": "adam",
        "lr": 1e-2,
        "betas": [0.9, 0.999],
        "weight_decay": 0.0,
        "max_grad_norm": None,
        "context_length": 16,
        "batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": 4,
        "gradient_checkpointing": False,
        "seed": 0,
        "log_every": 1,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
        "data": {"name": "pydoc", "source": "pydoc"},  # unread here: heal() is given its windows
    }
    cfg.update(overrides)
    return build_option("healing", cfg, "healing")


def one_batch(seed: int = 0, n: int = 4, length: int = 16) -> TokenBatches:
    """One full batch (no padding): every training step sees the same windows in any order."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (n, length), generator=g)
    return TokenBatches([TokenBatch(ids, torch.ones_like(ids))], length)


def random_transform(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.eye(HIDDEN) + 0.1 * torch.randn(HIDDEN, HIDDEN, generator=g)


def logits(model, batches: TokenBatches) -> torch.Tensor:
    batch = batches.batches[0]
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


def pruned_with_trainable_transform(
    placement: str, transform: torch.Tensor, dtype: torch.dtype = torch.float32, float32: bool = True
):
    """A tiny model (in ``dtype``) pruned at CUT with ``transform``, its T made a parameter
    (lt_only's start)."""
    model = tiny_model(num_layers=6).to(dtype)
    adapter = adapter_for(model)
    unfused = fusion_weights(adapter, [CUT])
    kept = prune(adapter, [CUT], {CUT: transform}, placement)
    trainable = attach_trainable_transforms(adapter, {CUT: transform}, kept, unfused, placement, float32)
    return model, adapter, trainable


def relative_update_error(trained: dict, reference: dict, start: dict) -> float:
    """``||(W - W0) - (W_ref - W0)|| / ||W_ref - W0||`` over all tensors (compared in float32)."""
    moved = torch.cat([(trained[n].float() - start[n]).flatten() for n in start])
    expected = torch.cat([(reference[n].float() - start[n]).flatten() for n in start])
    return float((moved - expected).norm() / expected.norm())


def bf16_and_fp32_reference():
    """A pruned tiny model in bfloat16 and the same weights in float32 (the reference)."""
    model = tiny_model(num_layers=6)
    prune(adapter_for(model), [CUT], {CUT: None})
    low = model.to(torch.bfloat16)
    reference = copy.deepcopy(low).to(torch.float32)
    return low, reference


@pytest.mark.parametrize("placement", ["fused", "separate"])
def test_a_trainable_transform_computes_what_the_pruned_model_computes(placement):
    transform = random_transform()
    reference = tiny_model(num_layers=6)
    prune(adapter_for(reference), [CUT], {CUT: transform}, placement)
    model, _, trainable = pruned_with_trainable_transform(placement, transform)
    batches = one_batch()
    torch.testing.assert_close(logits(model, batches), logits(reference, batches), rtol=1e-5, atol=1e-5)
    assert [p.shape for p in trainable.parameters.values()] == [(HIDDEN, HIDDEN)]


class ExplicitTransform(nn.Module):
    """``down(x) @ T`` written out by hand: the reference for lt_only's training."""

    def __init__(self, down: nn.Linear, transform: torch.Tensor):
        super().__init__()
        self.down = down
        self.transform = nn.Parameter(transform.clone())

    def forward(self, x):
        return self.down(x) @ self.transform


def test_lt_only_trains_exactly_t_like_a_hand_built_model_and_fuses_it_back():
    transform = random_transform()
    batches = one_batch()
    cfg = healing_cfg("lt_only", max_steps=3)
    # Reference: remove blocks 2 and 3 by hand, put an explicit T after block 1's down-projection,
    # and train that T alone with torch's Adam on the mean next-token loss.
    reference = tiny_model(num_layers=6)
    layers = reference.model.layers
    reference.model.layers = nn.ModuleList([layers[i] for i in (0, 1, 4, 5)])
    for i, layer in enumerate(reference.model.layers):
        layer.self_attn.layer_idx = i
    reference.config.num_hidden_layers = 4
    explicit = ExplicitTransform(reference.model.layers[1].mlp.down_proj, transform)
    reference.model.layers[1].mlp.down_proj = explicit
    optimizer = torch.optim.Adam([explicit.transform], lr=cfg.lr)
    ids = batches.batches[0].input_ids
    for _ in range(cfg.max_steps):
        optimizer.zero_grad()
        out = reference(input_ids=ids, use_cache=False).logits[:, :-1]
        nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1)).backward()
        optimizer.step()
    expected_t = explicit.transform.detach()

    model, adapter, trainable = pruned_with_trainable_transform("fused", transform)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    result = heal(adapter, batches, cfg, trainable)
    trained_t = trainable.parameters[1].detach()
    torch.testing.assert_close(trained_t, expected_t, rtol=1e-4, atol=1e-5)
    # Fused back: block 1's down-projection is T^T W of its unfused weight; nothing else moved.
    down = "model.layers.1.mlp.down_proj.weight"
    after = dict(model.named_parameters())
    plain = {n.replace(".base.weight", ".weight") for n in before if not n.endswith(".transform")}
    assert set(after) == plain, "the wrapper is gone: the same parameters as a plain pruned model"
    unfused_w = explicit.down.weight.detach().double()
    torch.testing.assert_close(after[down].detach().double(), trained_t.double().T @ unfused_w, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(after[name], before[name]) for name in plain if name != down)
    assert result.steps == 3 and result.trainable_params == HIDDEN * HIDDEN and result.tokens == 3 * 4 * 15
    expected_change = float((expected_t - transform).norm() / transform.norm())
    assert result.transform_change["2-4"] == pytest.approx(expected_change, rel=1e-3)
    assert result.loss_last < result.loss_first


def test_lt_only_with_the_separate_placement_trains_the_hook_transform():
    transform = random_transform()
    model, adapter, trainable = pruned_with_trainable_transform("separate", transform)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    result = heal(adapter, one_batch(), healing_cfg("lt_only", max_steps=3), trainable)
    stored = model._replaceme_separate_transforms[1]
    assert not torch.allclose(stored, transform) and result.loss_last < result.loss_first
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())  # only T moved


def test_full_model_healing_trains_every_weight():
    model = tiny_model(num_layers=6)
    adapter = adapter_for(model)
    prune(adapter, [CUT], {CUT: None})
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    result = heal(adapter, one_batch(), healing_cfg("full_model", lr=1e-3, gradient_checkpointing=True), None)
    after = dict(model.named_parameters())
    assert all(not torch.equal(after[name], before[name]) for name in before)
    assert result.trainable_params == sum(p.numel() for p in before.values())
    assert result.loss_last < result.loss_first
    assert not any(p.requires_grad for p in model.parameters())  # frozen again: the tiny model came frozen


@pytest.mark.slow
def test_full_model_healing_of_a_bf16_model_moves_it_as_far_as_in_fp32():
    """lr 3e-5 is below half the bf16 spacing of most weights (|w| ~ 0.1: spacing 4.9e-4): plain
    Adam on the bf16 weights loses most updates; float32 master weights keep them."""
    low, reference = bf16_and_fp32_reference()
    start = {n: p.detach().float().clone() for n, p in reference.named_parameters()}
    settings = {"lr": 3e-5, "max_steps": 60}
    heal(adapter_for(reference), one_batch(), healing_cfg("full_model", **settings), None)
    expected = dict(reference.named_parameters())
    legacy = copy.deepcopy(low)
    heal(adapter_for(low), one_batch(), healing_cfg("full_model", **settings), None)
    assert all(p.dtype == torch.bfloat16 for p in low.parameters())  # the model keeps its dtype
    assert relative_update_error(dict(low.named_parameters()), expected, start) < 0.25
    heal(adapter_for(legacy), one_batch(), healing_cfg("full_model", master_weights="model", **settings), None)
    assert relative_update_error(dict(legacy.named_parameters()), expected, start) > 0.8  # what it was


def test_lt_only_with_the_separate_placement_trains_a_float32_t_on_a_bf16_model():
    """T ~ I + noise: its diagonal's bf16 spacing (2^-7) is far above lr 3e-4, so a bf16 T keeps
    its diagonal; the float32 T follows the T trained on the float32 model."""
    transform = random_transform()
    cfg = healing_cfg("lt_only", lr=3e-4, max_steps=8)
    _, adapter, trainable = pruned_with_trainable_transform("separate", transform)
    heal(adapter, one_batch(), cfg, trainable)
    expected = adapter.model._replaceme_separate_transforms[1]
    runs = {}
    for float32 in (True, False):
        model, adapter, trainable = pruned_with_trainable_transform("separate", transform, torch.bfloat16, float32)
        assert trainable.parameters[1].dtype == (torch.float32 if float32 else torch.bfloat16)
        heal(adapter, one_batch(), cfg, trainable)
        runs[float32] = model._replaceme_separate_transforms[1]
    diagonal = {"T": transform.to(torch.bfloat16).float().diagonal()}
    trained = {float32: {"T": t.float().diagonal()} for float32, t in runs.items()}
    assert relative_update_error(trained[True], {"T": expected.diagonal()}, diagonal) < 0.25
    assert relative_update_error(trained[False], {"T": expected.diagonal()}, diagonal) > 0.9  # it barely moved


def test_lora_adapters_on_a_bf16_model_train_in_float32():
    low, _ = bf16_and_fp32_reference()
    peft_model = with_lora_adapters(adapter_for(low), healing_cfg("lora"))
    trained = [p for p in peft_model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)


def test_lora_heals_only_its_target_modules_and_merges_into_a_plain_model(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_model(num_layers=6)
    adapter = adapter_for(model)
    prune(adapter, [CUT], {CUT: None})
    names_before = {name for name, _ in model.named_parameters()}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    batches = one_batch()
    result = heal(adapter, batches, healing_cfg("lora", max_steps=6), None)
    after = dict(model.named_parameters())
    assert set(after) == names_before and not any("lora" in n for n, _ in model.named_modules())
    mlp = [n for n in before if ".mlp." in n]
    assert mlp and all(not torch.equal(after[n], before[n]) for n in mlp)
    assert all(torch.equal(after[n], before[n]) for n in before if ".mlp." not in n)
    r = 4
    assert result.trainable_params == 4 * sum(r * (a + b) for a, b in ((32, 64), (32, 64), (64, 32)))
    assert result.loss_last < result.loss_first
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    torch.testing.assert_close(logits(reloaded, batches), logits(model, batches))


def test_lora_names_a_target_module_the_model_lacks():
    model = tiny_model(num_layers=6)
    cfg = healing_cfg("lora")
    cfg.lora.target_modules = ["gate_proj", "dense_4h_to_h"]
    with pytest.raises(ConfigError, match="healing.lora.target_modules.*dense_4h_to_h"):
        heal(adapter_for(model), one_batch(), cfg, None)


def test_lora_on_mlp_targets_the_familys_own_mlp_projections():
    model = tiny_model("falcon", num_layers=4)
    adapter = adapter_for(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    cfg = healing_cfg("lora", max_steps=2)
    cfg.lora.target_modules = "mlp"
    heal(adapter, one_batch(), cfg, None)
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {n for n in before if "dense_h_to_4h" in n or "dense_4h_to_h" in n} and changed
