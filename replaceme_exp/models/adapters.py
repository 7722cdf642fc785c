"""Model adapters: where a family keeps its blocks, MLP output and fusion target.

One small class per model family (``replaceme_exp/models/families/``), registered by
``config.model_type`` in :data:`ADAPTERS`. The capture hooks,
the surgery and the evaluation go through an adapter and never through family-specific
attribute names.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import ClassVar, Iterator

import torch
from torch import nn

from replaceme_exp.data.batching import position_ids_for
from replaceme_exp.errors import ConfigError, UnsupportedModelError
from replaceme_exp.registry import Registry


def unfusable_error(reason: str) -> ConfigError:
    """The refusal of a T fused into the down-projection of a family where that is inexact
    (``reason``: its adapter's ``unfusable_reason``)."""
    return ConfigError("lt_placement", "fused", f"{reason}; use lt_placement=separate (T on the block output)")


class DecoderAdapter:
    """Llama-style decoder: ``model.model.layers[i]`` with ``.mlp.down_proj`` and
    ``.self_attn.layer_idx``; block output ``L = Y + MLP(norm(Y))``."""

    model_types: ClassVar[tuple[str, ...]] = ()
    # The linear layers of a block's MLP (healing.lora.target_modules=mlp).
    mlp_projection_names: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj", "down_proj")
    # The sub-modules of a block whose parameters a layer merge combines (LaCo: attention and MLP;
    # the block's norms stay the base block's).
    merged_modules: ClassVar[tuple[str, ...]] = ("self_attn", "mlp")
    # Why T cannot be fused into the down-projection (None: it can); such families take
    # lt_placement=separate, where T multiplies the whole block output.
    unfusable_reason: ClassVar[str | None] = None
    # Config fields holding one entry per block (sliced when blocks are removed).
    per_layer_config_fields: ClassVar[tuple[str, ...]] = ("layer_types",)
    # Config fields holding a block index threshold ("blocks below i do X").
    layer_threshold_config_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model: nn.Module):
        self.model = model

    @classmethod
    def block_config(cls, config):
        """The part of a model's ``config`` that sizes its blocks (``num_hidden_layers``,
        ``hidden_size``): the config itself, or a sub-config of families that nest one."""
        return config

    @property
    def config(self):
        return type(self).block_config(self.model.config)

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

    @property
    def final_norm(self) -> nn.Module | None:
        """The norm between the last block's output and the backbone's last hidden state (what
        ``output_hidden_states[-1]`` returns); None where there is none."""
        return self.backbone.norm

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
            raise unfusable_error(self.unfusable_reason)

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

    @contextmanager
    def without_blocks(self, removed: set[int] | list[int]) -> Iterator[None]:
        """The model with the blocks ``removed`` (current indices) taken out inside the block, as
        :meth:`keep_layers` leaves it, and exactly as before afterwards (the same block modules, their
        indices and every depth-dependent config field): a search that tries removals (SLEB) runs
        the model without them, nothing copied."""
        removed = set(removed)
        layers, config = self.layers, self.config
        saved = {
            f: getattr(config, f, None) for f in (*self.per_layer_config_fields, *self.layer_threshold_config_fields)
        }
        num_hidden_layers = config.num_hidden_layers
        self.keep_layers([i for i in range(len(layers)) if i not in removed])
        try:
            yield
        finally:
            self.replace_layers(layers)
            for index, layer in enumerate(layers):
                self.reindex_layer(layer, index)
            for field, value in saved.items():
                if value is not None:
                    setattr(config, field, value)
            config.num_hidden_layers = num_hidden_layers


ADAPTERS: Registry[type[DecoderAdapter]] = Registry("model.config.model_type", "model family")


def family(cls: type[DecoderAdapter]) -> type[DecoderAdapter]:
    """Register the decorated adapter for each of its ``model_types`` (one file per family in
    ``replaceme_exp/models/families/``)."""
    for model_type in cls.model_types:
        ADAPTERS.register(model_type, cls)
    return cls


# Families known and refused, with the reason.
UNSUPPORTED: dict[str, str] = {
    "gemma3": "a multimodal Gemma 3 checkpoint: prune its text model (model_type gemma3_text, Gemma3ForCausalLM)",
}


def adapter_class(config) -> type[DecoderAdapter]:
    """The adapter family of a model whose config is ``config``; a clear error for other families."""
    model_type = getattr(config, "model_type", None)
    if model_type in UNSUPPORTED:
        raise UnsupportedModelError("model.config.model_type", model_type, UNSUPPORTED[model_type])
    if model_type not in ADAPTERS:
        raise UnsupportedModelError(
            "model.config.model_type",
            model_type,
            f"no adapter for this model family; supported: {ADAPTERS.names()} "
            "(add one: docs/extending/model-family.md)",
        )
    return ADAPTERS.get(model_type)


def adapter_for(model: nn.Module) -> DecoderAdapter:
    """The adapter for ``model`` (a ``*ForCausalLM``); a clear error for other families."""
    return adapter_class(model.config)(model)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
