"""The selection metrics: how candidate cuts are compared (``selection.metric``).

Each metric is registered under its config name with what it is computed from:

- ``distance``: a per-token distance between ``L_{start-1}`` and ``L_{end-1}``, averaged over the
  tokens (all, or each sequence's last with ``selection.tokens=last``);
- ``sequence``: a distance per calibration sequence between its ``L_{start-1}`` and ``L_{end-1}``,
  averaged over the sequences (``channel_cosine``, registered by its method's plugin);
- ``similarity``: a similarity per cut from streamed moments (sums, ``L_k^T L_k``, cross products:
  :class:`~replaceme_exp.capture.similarity.SimilarityStatistics`), the cut of largest similarity
  chosen (distance ``1 - similarity``); over all tokens only;
- ``statistics``: a score per cut from the LS statistics of every candidate (the least-squares
  residual after the cut's own ridge transform, registered by :mod:`replaceme_exp.estimation`,
  which solves it); over all tokens only;
- ``accumulated``: a distance per cut from statistics the metric declares itself, those the core has no
  kind of its own for (a sublayer's input against its output, ...): ``accumulators`` (the candidates,
  the hidden size and the device -> :class:`~replaceme_exp.capture.accumulator.Accumulator` objects
  that the selection pass fills) and ``distances`` (the candidates and those, filled -> ``{cut:
  distance}``); over all tokens only;
- ``search``: a search that decides the removed blocks itself by running the model with
  candidate removals or merges (SLEB, LaCo): ``search`` (a
  :class:`~replaceme_exp.selection.search.SearchContext` -> a
  :class:`~replaceme_exp.selection.search.SearchResult`); its cuts need not be of one length and
  may start at block 0, and it may leave new weights for kept blocks (a merge).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from replaceme_exp.capture.similarity import CCA_RIDGE, linear_cka_per_cut, mean_cca_per_cut, pwcca_per_cut
from replaceme_exp.capture.statistics import cosine_distance
from replaceme_exp.config.schema import SelectionConfig
from replaceme_exp.errors import ConfigError
from replaceme_exp.registry import Registry


@dataclass(frozen=True)
class SelectionMetric:
    """``kind``: ``distance``, ``similarity``, ``statistics``, ``sequence``, ``accumulated`` or ``search`` (module
    docstring); ``token_distance`` ((n, d), (n, d) -> (n,)) for distances; ``similarity``
    (SimilarityStatistics -> {cut: value}) for similarities; ``from_statistics`` ({cut:
    LinearStats}, alpha -> {cut: distance}) for statistics; ``sequence_distance`` ((n_i, d), (n_i,
    d) -> ()) for sequences; ``accumulators`` and ``distances`` for accumulated ones; ``search``
    (SearchContext -> SearchResult) for searches;
    ``criterion``: what else its cached distances depend on (a ridge, ...); ``last_cut``: whether
    the cut ending at the last block is a candidate (``channel_cosine``'s authors never compare with the
    final block's output); ``settings``: the schema shape of its ``selection`` option when it has keys of its own (a
    search's, e.g. ``SlebSelectionConfig``; None: the plain one); ``fits_after``: a search that only
    removes blocks, over whose runs of removed blocks a transform may then be fitted (ShortGPT's
    Block Influence, SLEB's greedy removal; not a merge); ``stepwise``: a greedy search that runs
    step by step, each step a stage of its own (:func:`~replaceme_exp.selection.search.search_stage`)
    kept in the step store (:mod:`~replaceme_exp.selection.search_steps`): SLEB's; any other search
    runs in one stage ``selection search (<name>)`` and keeps nothing; ``text_only``: it runs a
    language model on text (windows of tokens, next-token losses), not a vision encoder."""

    name: str
    kind: str
    token_distance: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    similarity: Callable | None = None
    from_statistics: Callable | None = None
    sequence_distance: Callable | None = None
    search: Callable | None = None
    accumulators: Callable[[list, int, torch.device], list] | None = None
    distances: Callable[[list, list], dict] | None = None
    criterion: str = ""
    last_cut: bool = True
    settings: type | None = None
    fits_after: bool = False
    stepwise: bool = False
    text_only: bool = False

    @property
    def whole_sequence(self) -> bool:
        """Defined over all tokens only (``selection.tokens=last`` is refused)."""
        return self.kind != "distance"

    @property
    def takes_products(self) -> bool:
        """Computed from products of activations (their precision can move it)."""
        return self.kind in ("similarity", "statistics")

    @property
    def searches(self) -> bool:
        """Decides the removed blocks by a search of its own (``num_lts`` does not act)."""
        return self.kind == "search"

    @property
    def uses_statistics(self) -> bool:
        """Computed from the LS statistics of every candidate (alpha and the placement act on it)."""
        return self.kind == "statistics"

    def column_name(self, tokens: str) -> str:
        """The row's ``selection_metric``: the name, ``<name>_last`` when only last tokens count."""
        return self.name if tokens == "all" else f"{self.name}_last"

    def check(self, selection: SelectionConfig) -> None:
        """This metric's own settings in the ``selection`` option, before anything loads: the keys of its
        own shape (``settings``: a search's) and no key of another metric's own shape
        (``selection=<option>`` gives them), and the tokens it is computed over."""
        keys = {f.name for f in dataclasses.fields(selection)}
        base = {f.name for f in dataclasses.fields(SelectionConfig)}
        if self.settings is not None:
            own = {f.name for f in dataclasses.fields(self.settings)}
        else:  # keys that no metric declares are its option's own (its shape's)
            shapes = [m.settings for _, m in METRICS.items() if m.settings is not None]
            declared = {f.name for shape in shapes for f in dataclasses.fields(shape)}
            own = keys - (declared - base)
        if extra := sorted(keys - own):
            value = getattr(selection, extra[0])
            reason = f"is not a setting of selection.metric={self.name} (its keys: {', '.join(sorted(own))})"
            raise ConfigError(f"selection.{extra[0]}", value, reason)
        if missing := sorted(own - keys):
            reason = f"has settings of its own ({', '.join(missing)}): use selection={self.name}"
            raise ConfigError("selection.metric", self.name, reason)
        if self.whole_sequence and selection.tokens != "all":
            reason = f"selection.metric={self.name} is computed over all tokens"
            raise ConfigError("selection.tokens", selection.tokens, reason)


METRICS: Registry[SelectionMetric] = Registry("selection.metric", "selection metric")


def register(metric: SelectionMetric) -> SelectionMetric:
    return METRICS.register(metric.name, metric)


def angular_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row ``arccos(cos(a, b)) / pi`` (UIDL, Gromov et al.); (n, d), (n, d) -> (n,)."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12).clamp(-1.0, 1.0)
    return torch.arccos(cos) / math.pi


def euclidean_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row ``||a - b||``; (n, d), (n, d) -> (n,)."""
    return (a.float() - b.float()).norm(dim=-1)


register(SelectionMetric("cosine", "distance", token_distance=cosine_distance))
register(SelectionMetric("angular", "distance", token_distance=angular_distance))
register(SelectionMetric("l2", "distance", token_distance=euclidean_distance))
register(SelectionMetric("cka", "similarity", similarity=linear_cka_per_cut))
register(SelectionMetric("cca", "similarity", similarity=mean_cca_per_cut, criterion=f"/ridge={CCA_RIDGE}"))
register(SelectionMetric("pwcca", "similarity", similarity=pwcca_per_cut, criterion=f"/ridge={CCA_RIDGE}"))
