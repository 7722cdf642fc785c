"""Falcon, Phi-3, OLMo 2, Gemma 2 and Gemma 3: each family's pruned model against a hand-built
model with the blocks bypassed and T applied explicitly, its capture against activations computed
module by module, and save / reload / KV-cache generation."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.explicit_modules import Bypass, TransformedBlock, TransformedMLP, random_transform
from helpers.models import MORE_FAMILY_CONFIGS, tiny_model
from transformers import AutoModelForCausalLM

from replaceme_exp.capture import LinearStatistics, run_capture
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.runtime import run_recorded
from replaceme_exp.surgery import load_pruned, prune, save_checkpoint


FUSABLE = ["falcon", "falcon_sequential", "phi3"]
SEPARATE_ONLY = ["olmo2", "gemma2", "gemma3_text"]
assert sorted(FUSABLE + SEPARATE_ONLY) == sorted(MORE_FAMILY_CONFIGS)
CUTS = [(1, 3), (4, 6)]


def reference_model(model, cuts, transforms, placement):
    """The unpruned model with every cut block bypassed and T applied by an explicit module."""
    ref = copy.deepcopy(model)
    layers = adapter_for(ref).layers
    returns_tuple = ref.config.model_type == "falcon"
    for cut in cuts:
        start, end = cut
        if placement == "fused":
            layers[start - 1].mlp = TransformedMLP(layers[start - 1].mlp, transforms[cut])
        else:
            layers[start - 1] = TransformedBlock(layers[start - 1], transforms[cut])
        for i in range(start, end):
            layers[i] = Bypass(returns_tuple)
    return ref


def placement_of(family: str) -> str:
    return "fused" if family in FUSABLE else "separate"


@pytest.mark.parametrize("family", FUSABLE + SEPARATE_ONLY)
def test_pruned_model_equals_the_hand_built_one_and_reloads_and_generates(family, tmp_path, smollm2_tokenizer):
    model = tiny_model(family, 8, seed=4)
    placement = placement_of(family)
    transforms = {cut: random_transform(32, i) for i, cut in enumerate(CUTS)}
    ids = torch.randint(3, 128, (2, 12))
    expected = reference_model(model, CUTS, transforms, placement)(ids).logits
    pruned = copy.deepcopy(model)
    kept = prune(adapter_for(pruned), CUTS, transforms, placement)
    assert kept == [0, 3, 6, 7] and pruned.config.num_hidden_layers == 4
    torch.testing.assert_close(pruned(ids).logits, expected, rtol=1e-4, atol=1e-4)
    if getattr(model.config, "layer_types", None) is not None:  # Gemma: local/global layers follow the blocks
        assert pruned.config.layer_types == [model.config.layer_types[i] for i in kept]
    save_checkpoint(pruned, smollm2_tokenizer, tmp_path / "pruned", {"cuts": CUTS})
    reloaded = load_pruned(tmp_path / "pruned").eval()
    assert reloaded.config.num_hidden_layers == 4
    torch.testing.assert_close(reloaded(ids).logits, expected, rtol=1e-4, atol=1e-4)
    kwargs = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    with_cache = reloaded.generate(ids[:1], use_cache=True, **kwargs)
    assert with_cache.shape[1] == 12 + 10
    assert torch.equal(with_cache, reloaded.generate(ids[:1], use_cache=False, **kwargs))


@pytest.mark.parametrize("family", ["falcon", "falcon_sequential"])
def test_falcon_capture_stores_the_mlp_output_before_the_block_adds_attention_to_it(family):
    """Falcon adds the attention output to the MLP output in place after the MLP returns; the
    captured M must be the MLP's own output: statistics equal those of activations computed
    module by module (M = mlp(norm(X)), R = L_{end-1} - (L_{start-1} - M))."""
    model = tiny_model(family, 6, seed=1)
    sequences = random_sequences(5, 4, 10, seed=2)
    cuts = [(2, 4), (2, 5)]
    statistics = LinearStatistics(cuts, 32, torch.device("cpu"))
    run_capture(adapter_for(model), batches_of(sequences, 2, "left"), [statistics])
    block = model.transformer.h[1]  # the fusion target's block (cuts start at 2)
    mlp_inputs = []
    handle = block.mlp.register_forward_pre_hook(lambda module, args: mlp_inputs.append(args[0][0].clone()))
    expected = {cut: [0, 0] for cut in cuts}
    for seq in sequences:
        with torch.no_grad():
            hidden = model(torch.tensor([seq]), output_hidden_states=True).hidden_states  # block inputs
            m = block.mlp(mlp_inputs.pop())  # the MLP's own output, computed again from its input
        for cut in cuts:
            r = hidden[cut[1]][0] - (hidden[2][0] - m)  # L_{end-1} - Y_1 with Y_1 = L_1 - M_1
            expected[cut][0] = expected[cut][0] + m.double().T @ m.double()
            expected[cut][1] = expected[cut][1] + m.double().T @ r.double()
    handle.remove()
    for cut, (mtm, mtr) in expected.items():
        torch.testing.assert_close(statistics.result()[cut].mtm, mtm, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(statistics.result()[cut].mtr, mtr, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", SEPARATE_ONLY)
def test_families_with_a_norm_after_the_mlp_refuse_fusion_and_say_why(family):
    adapter = adapter_for(tiny_model(family, 4))
    with pytest.raises(ConfigError, match=r"^lt_placement='fused': .* norm after the MLP down-projection.*separate"):
        prune(adapter, [(1, 2)], {(1, 2): random_transform(32, 0)}, "fused")
    prune(adapter, [(1, 2)], {(1, 2): None}, "fused")  # plain removal fuses nothing: allowed


TINY = [
    "model=tiny_llama",
    "calibration.n_samples=8",
    "calibration.seq_len=32",
    "eval.seq_len=32",
    "eval.max_windows=2",
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
    "eval=heldout",  # held-out perplexity only (eval=quick would add lm-eval's offline tasks)
    "cuts=[[2,4]]",
]


@pytest.mark.slow
def test_a_falcon_job_prunes_fuses_and_saves_a_model_that_reloads_to_the_same_perplexity(tmp_path):
    overrides = [o for o in TINY if not o.startswith("model=")] + [f"results_dir={tmp_path}", "model=tiny_falcon"]
    overrides += ["save_model=full"]
    row = run_recorded(compose_config(overrides))
    assert row["status"] == "finished" and row["ppl_heldout"] != row["ppl_heldout_baseline"]
    reloaded = AutoModelForCausalLM.from_pretrained(row["pruned_model_path"])
    assert type(reloaded).__name__ == "FalconForCausalLM" and reloaded.config.num_hidden_layers == 4


@pytest.mark.slow
def test_an_olmo2_job_refuses_fusion_in_one_line_and_runs_with_the_separate_placement(tmp_path):
    overrides = TINY + [f"results_dir={tmp_path}", "model.name=tiny_olmo2", "model.config.model_type=olmo2"]
    overrides += ["save_model=false", "+model.config.eos_token_id=0"]
    refused = run_recorded(compose_config(overrides), raise_on_failure=False)
    assert refused["status"] == "failed" and "n_calib_tokens" not in refused  # before any data or capture
    assert refused["error"].startswith("ConfigError: lt_placement='fused': OLMo 2 applies a norm after the MLP")
    row = run_recorded(compose_config(overrides + ["lt_placement=separate"]))
    assert row["status"] == "finished" and row["lt_placement"] == "separate"
    assert row["cos_dist_after"] != row["cos_dist_before"] and row["ppl_heldout"] < float("inf")  # T applied
    # plain removal ranked by the LS residual: the fused residual's Y = L - M is wrong here too
    ranked = [o for o in overrides if not o.startswith("cuts=")] + ["objective=identity", "selection=ls_residual"]
    refused = run_recorded(compose_config(ranked), raise_on_failure=False)
    assert refused["status"] == "failed" and "n_calib_tokens" not in refused
    assert refused["error"].startswith("ConfigError: lt_placement='fused': OLMo 2 applies a norm after the MLP")
    row = run_recorded(compose_config(ranked + ["lt_placement=separate"]))
    assert row["status"] == "finished" and row["selection_metric"] == "ls_residual"


@pytest.mark.parametrize("family", ["llama", *FUSABLE, *SEPARATE_ONLY])
def test_each_familys_final_norm_gives_the_last_hidden_state_output_hidden_states_returns(family):
    """``capture.last_state=final_norm``'s norm: the adapter's ``final_norm`` of the last block's
    output (a hook) is ``output_hidden_states[-1]`` of a plain forward pass; the block's own output is not."""
    model = tiny_model(family, 4, seed=2)
    adapter = adapter_for(model)
    with torch.no_grad():  # a norm weight or bias that is not the identity's, as trained models have
        for p in adapter.final_norm.parameters():
            p.add_(torch.rand(p.shape, generator=torch.Generator().manual_seed(3)))
    caught = []
    hook = adapter.layers[-1].register_forward_hook(
        lambda m, a, out: caught.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        states = model(torch.randint(3, 128, (2, 9)), output_hidden_states=True).hidden_states
        normed = adapter.final_norm(caught[0])
    hook.remove()
    assert len(states) == adapter.num_layers + 1
    torch.testing.assert_close(normed, states[-1])
    assert not torch.allclose(caught[0], states[-1], rtol=1e-3)
