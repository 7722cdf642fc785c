"""Capture: stream calibration batches through the model and accumulate statistics in hooks.

Activations are flattened to the non-padding tokens of each batch, kept only until every
statistic that needs them has consumed them, and the forward pass stops after the last block
any statistic needs. No N x d buffer over the whole data set exists on this path.
"""

from replaceme_exp.capture.runner import plain_forward, run_capture
from replaceme_exp.capture.similarity import SimilarityStatistics
from replaceme_exp.capture.statistics import (
    CutDistances,
    LayerDistances,
    LinearStatistics,
    LinearStats,
    TransformDistances,
)
from replaceme_exp.capture.token_rules import TOKEN_RULES, TokenRule

__all__ = [
    "CutDistances",
    "LayerDistances",
    "LinearStatistics",
    "LinearStats",
    "SimilarityStatistics",
    "TOKEN_RULES",
    "TokenRule",
    "TransformDistances",
    "plain_forward",
    "run_capture",
]
