"""Families with a norm after the MLP down-projection (OLMo 2, Gemma 2, Gemma 3 text): T fused into
the down-projection would not be exact, so they take ``lt_placement=separate``."""

from __future__ import annotations

from replaceme_exp.models.adapters import DecoderAdapter, family

POST_MLP_NORM = (
    "{} applies a norm after the MLP down-projection (post_feedforward_layernorm), so T fused there is not exact"
)


@family
class Olmo2Adapter(DecoderAdapter):
    model_types = ("olmo2",)
    unfusable_reason = POST_MLP_NORM.format("OLMo 2")


@family
class Gemma2Adapter(DecoderAdapter):
    model_types = ("gemma2",)
    unfusable_reason = POST_MLP_NORM.format("Gemma 2")


@family
class Gemma3Adapter(DecoderAdapter):
    """Gemma 3's text model (``Gemma3ForCausalLM``); local and global layers follow the kept
    blocks through ``config.layer_types``."""

    model_types = ("gemma3_text",)
    unfusable_reason = POST_MLP_NORM.format("Gemma 3")
