"""What the unit, integration and e2e tests of race share: fixtures, builders and constants."""

from __future__ import annotations

import replaceme_exp.estimation  # noqa: F401 - registers the ls_residual selection
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.models import adapter_for
from replaceme_exp.selection.metrics import METRICS
from replaceme_exp.selection.passes import SelectionRequest, select_and_capture


def request(**changes) -> SelectionRequest:
    settings = dict(
        cuts=None, n_prune=2, num_lts=1, merge_consecutive=True, metric=METRICS.get("cosine"), tokens="all",
        alpha=0.0, placement="fused", rule=TokenRule(), precision="float64",
    )  # fmt: skip
    settings.update(changes)
    if isinstance(settings["metric"], str):
        settings["metric"] = METRICS.get(settings["metric"])
    return SelectionRequest(**settings)


def selected(model, batches, **changes):
    cache = StatisticsCache("unused", "model", "data", enabled=False)
    return select_and_capture(request(**changes), adapter_for(model), batches, cache, needs_stats=True)
