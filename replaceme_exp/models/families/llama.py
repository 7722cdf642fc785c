"""Llama-style decoders: ``model.model.layers[i]`` with ``.mlp.down_proj`` and ``.self_attn.layer_idx``
(the base adapter's layout) in Llama, Mistral, Qwen 2 / 3 and Phi-3."""

from __future__ import annotations

from replaceme_exp.models.adapters import DecoderAdapter, family


@family
class LlamaAdapter(DecoderAdapter):
    model_types = ("llama",)


@family
class MistralAdapter(DecoderAdapter):
    model_types = ("mistral",)


@family
class Qwen2Adapter(DecoderAdapter):
    model_types = ("qwen2", "qwen3")
    layer_threshold_config_fields = ("max_window_layers",)


@family
class Phi3Adapter(DecoderAdapter):
    """Phi-3: Llama-style blocks whose MLP fuses gate and up projections (``gate_up_proj``);
    the down-projection, T's fusion target, is separate."""

    model_types = ("phi3",)
    mlp_projection_names = ("gate_up_proj", "down_proj")
