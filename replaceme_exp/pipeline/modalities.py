"""Which modality a job is (:func:`modality_of`) and the registry of modalities (:data:`MODALITIES`, filled by
:mod:`.text` and :mod:`.vision`): what the rules ask before anything loads. Apart from the modality's
interface (:mod:`.modality`), whose stages read a job spec, so that the spec's rules import no module that
imports the spec."""

from __future__ import annotations

from replaceme_exp.config import schema
from replaceme_exp.models.loading import is_vision_config
from replaceme_exp.registry import Registry

MODALITIES: Registry[type] = Registry("modality", "modality")  # name -> a Modality subclass


def modality_of(model: schema.ModelConfig) -> str:
    """``vision`` for a vision encoder (CLIP), else ``text``."""
    return "vision" if is_vision_config(model) else "text"
