"""Data: calibration and held-out text, tokenised into padded batches."""

from replaceme_exp.data.batching import TokenBatch, TokenBatches, pack_windows, tokenize_documents
from replaceme_exp.data.calibration import build_calibration, heldout_windows

__all__ = [
    "TokenBatch",
    "TokenBatches",
    "build_calibration",
    "heldout_windows",
    "pack_windows",
    "tokenize_documents",
]
