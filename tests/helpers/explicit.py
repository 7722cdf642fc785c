"""An independent, hand-written forward pass of a Llama-family model: every block computed
from its parts, returning per-block X, Y, M, L (no hooks involved)."""

from __future__ import annotations

import torch


@torch.no_grad()
def explicit_blocks(model, ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """For one unpadded sequence ``ids`` (seq,): [{"X","Y","M","L"}] per block, each (seq, hidden)."""
    backbone = model.model
    seq = ids.shape[0]
    h = backbone.embed_tokens(ids[None])
    positions = torch.arange(seq)[None]
    rope = backbone.rotary_emb(h, positions)
    mask = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
    out = []
    for layer in backbone.layers:
        x = h
        attn, _ = layer.self_attn(
            hidden_states=layer.input_layernorm(x),
            attention_mask=mask,
            position_embeddings=rope,
            position_ids=positions,
        )
        y = x + attn
        m = layer.mlp(layer.post_attention_layernorm(y))
        h = y + m
        out.append({"X": x[0], "Y": y[0], "M": m[0], "L": h[0]})
    return out
