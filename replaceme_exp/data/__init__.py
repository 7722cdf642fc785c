"""Data: calibration text and images from registered sources (``calibration.source``: every module
of this package is imported, so a new source is one file that registers itself; see
docs/extending/calibration-source.md), held-out text, tokenised into padded batches."""

from replaceme_exp.data.batching import TokenBatch, TokenBatches, pack_windows, tokenize_documents
from replaceme_exp.data.calibration import CALIBRATION_SOURCES, build_calibration, heldout_windows
from replaceme_exp.registry import import_submodules

import_submodules(__name__)

__all__ = [
    "CALIBRATION_SOURCES",
    "TokenBatch",
    "TokenBatches",
    "build_calibration",
    "heldout_windows",
    "pack_windows",
    "tokenize_documents",
]
