"""One file per model family: an adapter (a :class:`~replaceme_exp.models.adapters.DecoderAdapter`
subclass registered with ``@family``) saying where the blocks, the MLP output and the fusion target
are. Every module here is imported with the package (docs/extending/model-family.md)."""

from replaceme_exp.registry import import_submodules

import_submodules(__name__)
