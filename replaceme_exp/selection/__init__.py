"""Selection: which blocks to cut. Candidate cuts and explicit cuts (:mod:`.cuts`), the metrics
that compare candidates (:mod:`.metrics`), and the capture passes that measure them and gather the
chosen cuts' statistics (:mod:`.passes`)."""

from replaceme_exp.registry import import_submodules
from replaceme_exp.selection.cuts import (
    Cut,
    candidate_cuts,
    cut_length,
    merge_consecutive_cuts,
    select_cuts,
    validate_cuts,
)
from replaceme_exp.selection.metrics import METRICS, SelectionMetric

import_submodules(__name__)  # every module registers what it defines (docs/extending/selection-metric.md)

__all__ = [
    "METRICS",
    "Cut",
    "SelectionMetric",
    "candidate_cuts",
    "cut_length",
    "merge_consecutive_cuts",
    "select_cuts",
    "validate_cuts",
]
