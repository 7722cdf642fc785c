"""The depth-pruning methods, one plugin module each (:mod:`~replaceme_exp.methods.plugin`): importing
the package registers every module in it, so adding a method is one file here (and its YAML)."""

from replaceme_exp.methods.plugin import (
    METHODS,
    Labelled,
    Method,
    column_meaning,
    job_methods,
    label_of,
    method_of_objective,
    method_of_selection,
    method_setting_columns,
)
from replaceme_exp.registry import import_submodules

import_submodules(__name__)

__all__ = [
    "column_meaning",
    "METHODS",
    "Labelled",
    "Method",
    "job_methods",
    "label_of",
    "method_of_objective",
    "method_of_selection",
    "method_setting_columns",
]
