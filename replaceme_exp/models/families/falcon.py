"""Falcon (Falcon 2 11B's parallel blocks, and the original sequential layout)."""

from __future__ import annotations

from torch import nn

from replaceme_exp.models.adapters import DecoderAdapter, family


@family
class FalconAdapter(DecoderAdapter):
    """Falcon: ``model.transformer.h[i]`` with ``.mlp.dense_4h_to_h`` and
    ``.self_attention.layer_idx``. With parallel attention (Falcon 2 11B, 7B, 40B) the block
    output is ``L = X + Attn(norm(X)) + MLP(norm(X))``, so ``Y = L - M = X + Attn`` and fusing T
    into ``dense_4h_to_h`` is exact as for sequential blocks. The block adds the attention output
    to the MLP output in place, after the MLP's forward hook: the capture copies ``M`` when the
    hook fires (boolean-mask indexing), before that addition."""

    model_types = ("falcon",)
    mlp_projection_names = ("dense_h_to_4h", "dense_4h_to_h")
    merged_modules = ("self_attention", "mlp")

    @property
    def backbone(self) -> nn.Module:
        return self.model.transformer

    @property
    def embeddings(self) -> nn.Embedding:
        return self.backbone.word_embeddings

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.h

    @property
    def final_norm(self) -> nn.Module:
        return self.backbone.ln_f

    def fusion_target(self, index: int) -> nn.Linear:
        return self.layers[index].mlp.dense_4h_to_h

    def replace_layers(self, layers: nn.ModuleList) -> None:
        self.backbone.h = layers

    def reindex_layer(self, layer: nn.Module, new_index: int) -> None:
        layer.self_attention.layer_idx = new_index
