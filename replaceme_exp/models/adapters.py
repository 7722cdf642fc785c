"""Model adapters: where a family keeps its blocks, MLP output and fusion target.

One small class per model family, registered by ``config.model_type``. The capture hooks,
the surgery and the evaluation go through an adapter and never through family-specific
attribute names.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from replaceme_exp.errors import UnsupportedModelError


class DecoderAdapter:
    """Llama-style decoder: ``model.model.layers[i]`` with ``.mlp.down_proj`` and
    ``.self_attn.layer_idx``; block output ``L = Y + MLP(norm(Y))``."""

    model_types: ClassVar[tuple[str, ...]] = ()
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
        """The linear layer whose output is ``M_index``: T is fused into it."""
        return self.layers[index].mlp.down_proj

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


ADAPTERS: dict[str, type[DecoderAdapter]] = {
    model_type: cls for cls in (LlamaAdapter, MistralAdapter, Qwen2Adapter) for model_type in cls.model_types
}

# Families whose block cannot take T exactly in its down-projection.
UNFUSABLE: dict[str, str] = {
    "gemma2": "Gemma 2 applies a norm after the MLP down-projection, so fusing T there is not exact",
    "gemma3": "Gemma 3 applies a norm after the MLP down-projection, so fusing T there is not exact",
    "gemma3_text": "Gemma 3 applies a norm after the MLP down-projection, so fusing T there is not exact",
}


def adapter_for(model: nn.Module) -> DecoderAdapter:
    """The adapter for ``model`` (a ``*ForCausalLM``); a clear error for other families."""
    model_type = getattr(model.config, "model_type", None)
    if model_type in UNFUSABLE:
        raise UnsupportedModelError("model.config.model_type", model_type, UNFUSABLE[model_type])
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
