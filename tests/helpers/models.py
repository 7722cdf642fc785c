"""Random-weight 2-to-8-block causal LMs per family, small enough for a CPU test."""

from __future__ import annotations

import torch

FAMILY_CONFIGS = {
    "llama": dict(model_type="llama"),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=2),
    "qwen3": dict(model_type="qwen3", head_dim=16),
}
# Further families, each a random 2-8 block model in its own layout (tests/integration/models/test_model_families.py).
MORE_FAMILY_CONFIGS = {
    # Falcon 2 11B's layout: parallel attention and MLP from one norm, grouped KV heads.
    "falcon": dict(
        model_type="falcon",
        new_decoder_architecture=True,
        parallel_attn=True,
        num_ln_in_parallel_attn=1,
        num_kv_heads=2,
        ffn_hidden_size=64,
        bias=False,
        alibi=False,
    ),
    # The original Falcon layout with sequential attention and MLP and biased linears.
    "falcon_sequential": dict(
        model_type="falcon", new_decoder_architecture=False, parallel_attn=False, multi_query=True, bias=True
    ),
    "phi3": dict(model_type="phi3", pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "olmo2": dict(model_type="olmo2", pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "gemma2": dict(model_type="gemma2", head_dim=16, query_pre_attn_scalar=16, sliding_window=4),
    "gemma3_text": dict(model_type="gemma3_text", head_dim=16, query_pre_attn_scalar=16, sliding_window=4),
}


def tiny_model(family: str = "llama", num_layers: int = 6, seed: int = 0, vocab: int = 128, **overrides):
    """A random-weight causal LM of the given family, eval mode, float32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    kwargs.update({**FAMILY_CONFIGS, **MORE_FAMILY_CONFIGS}[family])
    kwargs.update(overrides)
    config = AutoConfig.for_model(**kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Larger weights than the default init so that blocks change the residual stream visibly.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, 0.15)
    return model.eval().requires_grad_(False)
