"""Model adapters: where a family keeps its blocks, MLP output and fusion target.

One small class per model family, registered by ``config.model_type``. The capture hooks,
the surgery and the evaluation go through an adapter and never through family-specific
attribute names.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from replaceme_exp.errors import ConfigError, UnsupportedModelError


class DecoderAdapter:
    """Llama-style decoder: ``model.model.layers[i]`` with ``.mlp.down_proj`` and
    ``.self_attn.layer_idx``; block output ``L = Y + MLP(norm(Y))``."""

    model_types: ClassVar[tuple[str, ...]] = ()
    # The linear layers of a block's MLP (healing.lora.target_modules=mlp).
    mlp_projection_names: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj", "down_proj")
    # Why T cannot be fused into the down-projection (None: it can); such families take
    # lt_placement=separate, where T multiplies the whole block output.
    unfusable_reason: ClassVar[str | None] = None
    # Config fields holding one entry per block (sliced when blocks are removed).
    per_layer_config_fields: ClassVar[tuple[str, ...]] = ("layer_types",)
    # Config fields holding a block index threshold ("blocks below i do X").
    layer_threshold_config_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model: nn.Module):
        self.model = model

    @property
    def config(self):
        return self.model.config

    @property
    def backbone(self) -> nn.Module:
        """The decoder stack without the LM head: ``forward(input_ids, attention_mask,
        position_ids) -> last_hidden_state``."""
        return self.model.model

    @property
    def embeddings(self) -> nn.Module:
        """The input embedding (a module with a ``weight``): its device is where a batch goes."""
        return self.backbone.embed_tokens

    def forward_batch(self, batch, device: torch.device):
        """Run the blocks on one batch (a :class:`~replaceme_exp.data.batching.TokenBatch`) on
        ``device``; the capture hooks read what they need on the way."""
        from replaceme_exp.data.batching import position_ids_for

        mask = batch.attention_mask.to(device)
        positions = batch.position_ids.to(device) if batch.position_ids is not None else position_ids_for(mask)
        return self.backbone(
            input_ids=batch.input_ids.to(device), attention_mask=mask, position_ids=positions, use_cache=False
        )

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.layers

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def mlp(self, index: int) -> nn.Module:
        """The module whose output is ``M_index`` (the MLP output before the residual add)."""
        return self.layers[index].mlp

    def fusion_target(self, index: int) -> nn.Linear:
        """The linear layer whose output is ``M_index``: T is fused into it. Refused, with the
        reason, for families where that is inexact (:attr:`unfusable_reason`)."""
        self.require_fusable()
        return self.layers[index].mlp.down_proj

    def require_fusable(self) -> None:
        if self.unfusable_reason is not None:
            raise ConfigError(
                "lt_placement", "fused", f"{self.unfusable_reason}; use lt_placement=separate (T on the block output)"
            )

    def replace_layers(self, layers: nn.ModuleList) -> None:
        """Put the kept blocks where the family keeps its blocks."""
        self.backbone.layers = layers

    def reindex_layer(self, layer: nn.Module, new_index: int) -> None:
        layer.self_attn.layer_idx = new_index
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = new_index

    def keep_layers(self, kept: list[int]) -> None:
        """Keep only the blocks with the given (original) indices, re-indexed 0..len-1,
        and update every depth-dependent config field."""
        old = self.layers
        self.replace_layers(nn.ModuleList([old[i] for i in kept]))
        for new_index, layer in enumerate(self.layers):
            self.reindex_layer(layer, new_index)
        config = self.config
        for field in self.per_layer_config_fields:
            values = getattr(config, field, None)
            if isinstance(values, (list, tuple)) and len(values) == len(old):
                setattr(config, field, [values[i] for i in kept])
        for field in self.layer_threshold_config_fields:
            threshold = getattr(config, field, None)
            if isinstance(threshold, int):
                setattr(config, field, sum(1 for i in kept if i < threshold))
        config.num_hidden_layers = len(kept)


class LlamaAdapter(DecoderAdapter):
    model_types = ("llama",)


class MistralAdapter(DecoderAdapter):
    model_types = ("mistral",)


class Qwen2Adapter(DecoderAdapter):
    model_types = ("qwen2", "qwen3")
    layer_threshold_config_fields = ("max_window_layers",)


class Phi3Adapter(DecoderAdapter):
    """Phi-3: Llama-style blocks whose MLP fuses gate and up projections (``gate_up_proj``);
    the down-projection, T's fusion target, is separate."""

    model_types = ("phi3",)
    mlp_projection_names = ("gate_up_proj", "down_proj")


class FalconAdapter(DecoderAdapter):
    """Falcon: ``model.transformer.h[i]`` with ``.mlp.dense_4h_to_h`` and
    ``.self_attention.layer_idx``. With parallel attention (Falcon 2 11B, 7B, 40B) the block
    output is ``L = X + Attn(norm(X)) + MLP(norm(X))``, so ``Y = L - M = X + Attn`` and fusing T
    into ``dense_4h_to_h`` is exact as for sequential blocks. The block adds the attention output
    to the MLP output in place, after the MLP's forward hook: the capture copies ``M`` when the
    hook fires (boolean-mask indexing), before that addition."""

    model_types = ("falcon",)
    mlp_projection_names = ("dense_h_to_4h", "dense_4h_to_h")

    @property
    def backbone(self) -> nn.Module:
        return self.model.transformer

    @property
    def embeddings(self) -> nn.Embedding:
        return self.backbone.word_embeddings

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.h

    def fusion_target(self, index: int) -> nn.Linear:
        return self.layers[index].mlp.dense_4h_to_h

    def replace_layers(self, layers: nn.ModuleList) -> None:
        self.backbone.h = layers

    def reindex_layer(self, layer: nn.Module, new_index: int) -> None:
        layer.self_attention.layer_idx = new_index


POST_MLP_NORM = (
    "{} applies a norm after the MLP down-projection (post_feedforward_layernorm), so T fused there is not exact"
)


class Olmo2Adapter(DecoderAdapter):
    model_types = ("olmo2",)
    unfusable_reason = POST_MLP_NORM.format("OLMo 2")


class Gemma2Adapter(DecoderAdapter):
    model_types = ("gemma2",)
    unfusable_reason = POST_MLP_NORM.format("Gemma 2")


class Gemma3Adapter(DecoderAdapter):
    """Gemma 3's text model (``Gemma3ForCausalLM``); local and global layers follow the kept
    blocks through ``config.layer_types``."""

    model_types = ("gemma3_text",)
    unfusable_reason = POST_MLP_NORM.format("Gemma 3")


class ClipVisionAdapter(DecoderAdapter):
    """CLIP's vision encoder (``CLIPModel``, ``CLIPVisionModel``, ``CLIPVisionModelWithProjection``):
    ``vision_model.encoder.layers[i]``, pre-norm blocks ``L = Y + fc2(gelu(fc1(norm(Y))))``. T is
    fused into ``fc2``, bias included (``T^T W``, ``T^T b``). Every image position (the class token
    and each patch) is a token of the capture. Depth lives in ``vision_config.num_hidden_layers``
    (the text tower of a ``CLIPModel`` is left as it is)."""

    model_types = ("clip", "clip_vision_model")
    mlp_projection_names = ("fc1", "fc2")
    per_layer_config_fields = ()

    @property
    def config(self):
        config = self.model.config
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


ADAPTERS: dict[str, type[DecoderAdapter]] = {
    model_type: cls
    for cls in (
        LlamaAdapter,
        MistralAdapter,
        Qwen2Adapter,
        Phi3Adapter,
        FalconAdapter,
        Olmo2Adapter,
        Gemma2Adapter,
        Gemma3Adapter,
        ClipVisionAdapter,
    )
    for model_type in cls.model_types
}

# Families known and refused, with the reason.
UNSUPPORTED: dict[str, str] = {
    "gemma3": "a multimodal Gemma 3 checkpoint: prune its text model (model_type gemma3_text, Gemma3ForCausalLM)",
}


def adapter_for(model: nn.Module) -> DecoderAdapter:
    """The adapter for ``model`` (a ``*ForCausalLM``); a clear error for other families."""
    model_type = getattr(model.config, "model_type", None)
    if model_type in UNSUPPORTED:
        raise UnsupportedModelError("model.config.model_type", model_type, UNSUPPORTED[model_type])
    if model_type not in ADAPTERS:
        raise UnsupportedModelError(
            "model.config.model_type",
            model_type,
            f"no adapter for this model family; supported: {sorted(ADAPTERS)} "
            "(add a DecoderAdapter subclass in replaceme_exp/models/adapters.py)",
        )
    return ADAPTERS[model_type](model)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
