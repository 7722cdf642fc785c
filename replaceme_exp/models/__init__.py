"""Models: loading (hub, embedded SmolLM2, random-weight configs) and family adapters."""

from replaceme_exp.models.adapters import DecoderAdapter, adapter_for, count_parameters
from replaceme_exp.models.loading import LoadedModel, load_model

__all__ = ["DecoderAdapter", "LoadedModel", "adapter_for", "count_parameters", "load_model"]
