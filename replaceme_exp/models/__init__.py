"""Models: loading (hub, embedded SmolLM2, random-weight configs) and the family adapters
(one file per family in :mod:`.families`, registered by ``config.model_type``)."""

from replaceme_exp.models import families  # noqa: F401  (registers every family's adapter)
from replaceme_exp.models.adapters import ADAPTERS, DecoderAdapter, adapter_for, count_parameters
from replaceme_exp.models.loading import LoadedModel, load_model

__all__ = ["ADAPTERS", "DecoderAdapter", "LoadedModel", "adapter_for", "count_parameters", "load_model"]
