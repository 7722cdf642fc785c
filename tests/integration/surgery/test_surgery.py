"""Fusion, block removal and checkpoints against a hand-built unpruned model with explicit T."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.explicit_modules import Bypass, TransformedBlock, TransformedMLP, random_transform
from helpers.models import FAMILY_CONFIGS, tiny_model
from transformers import AutoModelForCausalLM

from replaceme_exp.errors import UnsupportedModelError
from replaceme_exp.models import adapter_for, count_parameters
from replaceme_exp.surgery import prune, save_checkpoint


def reference_model(model, cuts, transforms):
    """The unpruned model with the cut blocks bypassed and T applied after the MLP output."""
    ref = copy.deepcopy(model)
    layers = ref.model.layers
    for start, end in cuts:
        if transforms.get((start, end)) is not None:
            layers[start - 1].mlp = TransformedMLP(layers[start - 1].mlp, transforms[(start, end)])
        for i in range(start, end):
            layers[i] = Bypass()
    return ref


@pytest.mark.parametrize(
    "cuts", [[(2, 4)], [(1, 2), (3, 5)], [(2, 3), (4, 6), (7, 8)], [(5, 8)]], ids=["one", "two", "three", "to-end"]
)
@pytest.mark.parametrize("mlp_bias", [False, True])
def test_pruned_logits_equal_bypassed_model_with_explicit_transform(cuts, mlp_bias):
    model = tiny_model("llama", 8, seed=2, mlp_bias=mlp_bias)
    transforms = {cut: random_transform(32, i) for i, cut in enumerate(cuts)}
    ids = torch.randint(0, 128, (2, 11))
    expected = reference_model(model, cuts, transforms)(ids).logits
    pruned = copy.deepcopy(model)
    kept = prune(adapter_for(pruned), cuts, transforms)
    assert pruned.config.num_hidden_layers == 8 - sum(e - s for s, e in cuts) == len(kept)
    assert [layer.self_attn.layer_idx for layer in pruned.model.layers] == list(range(len(kept)))
    torch.testing.assert_close(pruned(ids).logits, expected, rtol=1e-4, atol=1e-4)
    assert count_parameters(pruned) < count_parameters(model)


def test_identity_transform_only_removes_blocks():
    model = tiny_model("llama", 6)
    pruned = copy.deepcopy(model)
    prune(adapter_for(pruned), [(2, 4)], {(2, 4): None})
    torch.testing.assert_close(pruned.model.layers[1].mlp.down_proj.weight, model.model.layers[1].mlp.down_proj.weight)
    ids = torch.randint(0, 128, (1, 7))
    torch.testing.assert_close(
        pruned(ids).logits, reference_model(model, [(2, 4)], {})(ids).logits, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_saved_checkpoint_reloads_and_generates_with_kv_cache(family, tmp_path, smollm2_tokenizer):
    model = tiny_model(family, 6, seed=3)
    cuts = [(1, 2), (3, 5)]
    prune(adapter_for(model), cuts, {cut: random_transform(32, 7) for cut in cuts})
    save_checkpoint(model, smollm2_tokenizer, tmp_path / "pruned", {"cuts": cuts})
    assert {p.name for p in (tmp_path / "pruned").iterdir()} >= {"config.json", "model.safetensors", "replaceme.json"}
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    assert reloaded.config.num_hidden_layers == 3
    if getattr(model.config, "layer_types", None) is not None:
        assert len(reloaded.config.layer_types) == 3
    ids = torch.randint(0, 128, (1, 9))
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with_cache = reloaded.generate(ids, use_cache=True, **kwargs)
    without_cache = reloaded.generate(ids, use_cache=False, **kwargs)
    assert with_cache.shape[1] == 9 + 12
    assert torch.equal(with_cache, without_cache)


def test_qwen2_sliding_window_layers_follow_the_kept_blocks():
    model = tiny_model("qwen2", 6)
    before = list(model.config.layer_types)
    assert "sliding_attention" in before and "full_attention" in before
    prune(adapter_for(model), [(1, 3)], {(1, 3): None})
    assert model.config.layer_types == [before[i] for i in (0, 3, 4, 5)]
    assert model.config.max_window_layers == 1  # blocks 0 and 1 were below 2; block 1 is gone
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2, 3]


def test_unknown_families_are_refused():
    """(Families with a norm after the MLP: tests/integration/models/test_model_families.py.)"""
    from transformers import AutoConfig
    from transformers import AutoModelForCausalLM as Auto

    gpt2 = Auto.from_config(AutoConfig.for_model("gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UnsupportedModelError, match="gpt2.*no adapter"):
        adapter_for(gpt2)


@pytest.mark.parametrize("cuts", [[(2, 4)], [(1, 3), (5, 7)]], ids=["one", "two"])
def test_separate_placement_equals_bypass_with_transform_on_the_block_output(cuts, tmp_path, smollm2_tokenizer):
    from replaceme_exp.surgery import load_pruned

    model = tiny_model("llama", 8, seed=9)
    transforms = {cut: random_transform(32, i + 3) for i, cut in enumerate(cuts)}
    reference = copy.deepcopy(model)
    for start, end in cuts:
        reference.model.layers[start - 1] = TransformedBlock(
            reference.model.layers[start - 1], transforms[(start, end)]
        )
        for i in range(start, end):
            reference.model.layers[i] = Bypass()
    ids = torch.randint(0, 128, (2, 10))
    pruned = copy.deepcopy(model)
    prune(adapter_for(pruned), cuts, transforms, placement="separate")
    torch.testing.assert_close(pruned(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
    # Weights untouched: the fusion target keeps its original down-projection.
    torch.testing.assert_close(
        pruned.model.layers[cuts[0][0] - 1].mlp.down_proj.weight,
        model.model.layers[cuts[0][0] - 1].mlp.down_proj.weight,
    )
    save_checkpoint(pruned, smollm2_tokenizer, tmp_path / "sep", {"lt_placement": "separate"})
    assert (tmp_path / "sep" / "separate_transforms.safetensors").is_file()
    reloaded = load_pruned(tmp_path / "sep").eval()
    torch.testing.assert_close(reloaded(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "sep").eval()  # without T: not the same model
    assert not torch.allclose(plain(ids).logits, reference(ids).logits, atol=1e-3)
