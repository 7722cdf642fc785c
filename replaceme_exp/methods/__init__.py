"""The depth-pruning methods, one plugin module each (:mod:`~replaceme_exp.methods.plugin`): importing
the package registers every module in it, so adding a method is one file here (and its YAML), then the
installed plugins' modules (:mod:`replaceme_exp.plugins`: a method in another package)."""

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
from replaceme_exp.plugins import load_plugins
from replaceme_exp.registry import import_submodules

import_submodules(__name__)
load_plugins()

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
