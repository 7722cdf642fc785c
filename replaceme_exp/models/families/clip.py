"""CLIP's vision encoder."""

from __future__ import annotations

import torch
from torch import nn

from replaceme_exp.models.adapters import DecoderAdapter, family


@family
class ClipVisionAdapter(DecoderAdapter):
    """CLIP's vision encoder (``CLIPModel``, ``CLIPVisionModel``, ``CLIPVisionModelWithProjection``):
    ``vision_model.encoder.layers[i]``, pre-norm blocks ``L = Y + fc2(gelu(fc1(norm(Y))))``. T is
    fused into ``fc2``, bias included (``T^T W``, ``T^T b``). Every image position (the class token
    and each patch) is a token of the capture. Depth lives in ``vision_config.num_hidden_layers``
    (the text tower of a ``CLIPModel`` is left as it is)."""

    model_types = ("clip", "clip_vision_model")
    mlp_projection_names = ("fc1", "fc2")
    per_layer_config_fields = ()

    @classmethod
    def block_config(cls, config):
        return getattr(config, "vision_config", config)

    @property
    def backbone(self) -> nn.Module:
        """The vision transformer: ``forward(pixel_values) -> last_hidden_state, pooler_output``
        (a ``CLIPModel``'s ``vision_model``; a ``CLIPVisionModel`` is one itself)."""
        return getattr(self.model, "vision_model", self.model)

    @property
    def embeddings(self) -> nn.Module:
        return self.backbone.embeddings.patch_embedding

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.encoder.layers

    @property
    def final_norm(self) -> None:
        """None: the encoder's last hidden state is the last block's output (``post_layernorm``
        acts on the pooled class token only)."""
        return None

    def forward_batch(self, batch, device: torch.device):
        return self.backbone(pixel_values=batch.pixel_values.to(device=device, dtype=self.embeddings.weight.dtype))

    def fusion_target(self, index: int) -> nn.Linear:
        return self.layers[index].mlp.fc2

    def replace_layers(self, layers: nn.ModuleList) -> None:
        self.backbone.encoder.layers = layers

    def reindex_layer(self, layer: nn.Module, new_index: int) -> None:
        """CLIP's attention keeps no layer index (it has no KV cache)."""

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The model's image embeddings, (batch, projection_dim), before normalisation: the pooled
        class token through ``visual_projection`` (``CLIPModel`` / ``...WithProjection``), or the
        pooled output of a bare ``CLIPVisionModel``."""
        pooled = self.backbone(pixel_values=pixel_values.to(self.embeddings.weight.dtype)).pooler_output
        projection = getattr(self.model, "visual_projection", None)
        return projection(pooled) if projection is not None else pooled
