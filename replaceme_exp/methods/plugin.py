"""A depth-pruning method as a plugin: one module under ``replaceme_exp/methods/`` registers a
:class:`Method` that says everything the harness needs to know about it, so that the spine
(``pipeline/``, the schema, the rules, the surgery, the reports) names no method.

A job's methods are found from its components: the method whose estimator the ``objective`` builds
(:func:`method_of_objective`), and the method whose own search chose the cuts
(:func:`method_of_selection`, ShortGPT, SLEB, LaCo). The table name (the row's ``method``) is the
objective's method's :attr:`Method.label`, told the selection's method (ReplaceMe LS "on ShortGPT
cuts"; a plain removal is named by the search that chose it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from replaceme_exp.config import schema
from replaceme_exp.config.protocol import left_to_protocol, protocol_rule
from replaceme_exp.estimation.estimators import Estimator, Requirements, estimator_class
from replaceme_exp.models.shape import ModelShape
from replaceme_exp.registry import Registry


@dataclass(frozen=True)
class Labelled:
    """What a method's name in tables is decided from: the job's ``config``, its selection as it acts
    (``selection_metric``: ``angular_last``, ``cosine``, ...; None for given cuts) and the method whose
    search chose the cuts (``search``; None: a distance chose them, or they were given)."""

    config: schema.JobConfig
    selection_metric: str | None
    search: "Method | None"


@dataclass(frozen=True)
class Method:
    """One depth-pruning method.

    ``name``: its key; ``title``: its name in prose; ``docs``: its page, ``docs/methods/<docs>``;
    ``estimators``: the estimator classes whose ``objective`` makes it; ``selections``: the
    ``selection.metric`` names of its own searches; ``label``: its name in tables (the row's
    ``method``) for a job (:class:`Labelled`); ``search_label``: its name as the search that chose
    another method's cuts (``ShortGPT`` in "ReplaceMe LS on ShortGPT cuts"); ``follows_protocol``:
    whether ``protocol=official``'s settings of the fit apply to it (ReplaceMe's and UIDL's: the
    official code is theirs); ``official_4bit_evaluation``: whether, with ``model.capture_4bit`` under
    ``protocol=official``, the official code scores the pruned model as a 4-bit copy (UIDL's
    ``uidl_method.py`` saves the truncated model in 4 bits and evaluates it)."""

    name: str
    title: str
    docs: str
    label: Callable[[Labelled], str]
    estimators: tuple[type[Estimator], ...] = ()
    selections: tuple[str, ...] = ()
    search_label: str | None = None
    follows_protocol: bool = False
    official_4bit_evaluation: bool = False
    presets: tuple[str, ...] = field(default=())
    check_shape: Callable[[schema.JobConfig, ModelShape], None] | None = None
    check: Callable[[schema.JobConfig, Requirements], None] | None = None
    identity: Callable[[schema.JobConfig, dict], None] | None = None
    setting_columns: dict[str, str] = field(default_factory=dict)
    settings_of: Callable[[schema.JobConfig], dict] | None = None
    column_docs: dict[str, str] = field(default_factory=dict)


METHODS: Registry[Method] = Registry("method", "depth-pruning method")


def register(method: Method) -> Method:
    """Register ``method`` (its module's last statement)."""
    return METHODS.register(method.name, method)


def method_of_objective(objective: schema.ObjectiveConfig) -> Method | None:
    """The method whose estimator ``objective`` builds (None: an estimator no method declares)."""
    estimator = estimator_class(objective)
    found = [m for _, m in METHODS.items() if any(issubclass(estimator, e) for e in m.estimators)]
    return max(found, key=lambda m: max(len(e.__mro__) for e in m.estimators if issubclass(estimator, e)), default=None)


def method_of_selection(config: schema.JobConfig) -> Method | None:
    """The method whose own search chose the job's cuts (None: a distance chose them, or they were given)."""
    if config.cuts is not None:
        return None
    return next((m for _, m in METHODS.items() if config.selection.metric in m.selections), None)


def job_methods(config: schema.JobConfig) -> list[Method]:
    """The methods a job runs: its objective's, and the one whose search chose its cuts."""
    found = [method_of_objective(config.objective), method_of_selection(config)]
    return [m for i, m in enumerate(found) if m is not None and m not in found[:i]]


def method_setting_columns(config: schema.JobConfig) -> dict:
    """Every method's setting columns: the values of the job's methods' own, None for the others'."""
    out: dict = {}
    mine = job_methods(config)
    for _, method in METHODS.items():
        values = method.settings_of(config) if method in mine and method.settings_of is not None else {}
        out.update({name: values.get(name) for name in method.setting_columns})
    return out


def column_meaning(column: str) -> str | None:
    """What a method's own row column means (None: no method declares ``column``)."""
    for _, method in METHODS.items():
        for name, text in {**method.setting_columns, **method.column_docs}.items():
            if names(name, column):
                return text
    return None


def names(name: str, column: str) -> bool:
    """Whether the declared ``name`` (``<word>`` standing for any text) is ``column``."""
    parts = re.split(r"(<[^>]+>)", name)
    return re.fullmatch("".join(".+" if p.startswith("<") else re.escape(p) for p in parts), column) is not None


def label_of(config: schema.JobConfig, selection_metric: str | None) -> str:
    """The job's method as tables name it, before any healing (an estimator no method declares:
    its objective's name)."""
    method = method_of_objective(config.objective)
    if method is None:
        return config.objective.name
    return method.label(Labelled(config, selection_metric, method_of_selection(config)))


@protocol_rule("estimation.padded_positions")
def padded_positions_of_the_protocol(config: schema.JobConfig) -> dict:
    """Under ``protocol=official``, for a method that follows it (ReplaceMe's and UIDL's): padded
    positions in a fit of every token (lstsq.py / cosine_dist.py: ``view(-1, hidden)`` of padded
    batches keeps them), but not with masking (masked copies carry their own positions) or left
    padding. Under ``protocol=paper``, and for the other methods: none."""
    if not left_to_protocol(config, "estimation.padded_positions"):
        return {}
    method = method_of_objective(config.objective)
    padded = (
        config.protocol == "official"
        and method is not None
        and method.follows_protocol
        and config.estimation.tokens == "all"
        and config.mask_ratio == 0
        and getattr(config.calibration, "padding_side", "right") == "right"
    )
    return {"estimation.padded_positions": padded}
