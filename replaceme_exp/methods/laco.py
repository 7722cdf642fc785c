"""LaCo (Yang et al. 2024, *LaCo: Large Language Model Pruning via Layer Collapse*;
docs/methods/laco.md): runs of consecutive blocks merged into the first (RDSC), each merge kept while
the merged model's outputs stay close to the unpruned model's (``experiment=laco``); its search is
replaceme_exp/selection/laco.py."""

from typing import Literal, Optional

from replaceme_exp.config import schema
from replaceme_exp.config.schema import (
    Group,
    SelectionConfig,
    at_least_two,
    key,
    non_negative_int,
    positive_int,
    register_shape,
)
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.models.shape import ModelShape
from replaceme_exp.selection.laco import LacoPlan, laco_search
from replaceme_exp.selection.metrics import METRICS, SelectionMetric


def cosine_threshold(v) -> str | None:
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    return None if number and -1 <= v < 1 else "must be a cosine similarity in [-1, 1)"


@register_shape("selection")
@Group
class LacoSelectionConfig(SelectionConfig):
    """``selection=laco``: merge runs of ``merge_layers`` consecutive blocks into the first, from the
    top down, each merge kept when the merged model's final hidden states on ``samples`` calibration
    sequences stay above cosine ``threshold`` of the unpruned model's. Defaults: the official code's
    Llama 2 13B notebook; null ``merge_layers`` and ``highest`` are set from the model's depth."""

    merge_layers: Optional[int] = key(
        None, doc="C: blocks combined by one merge (null: 1 + 6/40 of the depth, rounded)", check=at_least_two
    )
    interval: int = key(1, doc="I: how far the search moves down after a kept merge", check=positive_int)
    threshold: float = key(0.45, doc="T: keep a merge whose mean cosine similarity is above", check=cosine_threshold)
    lowest: int = key(0, doc="L: the lowest block a merge may start at", check=non_negative_int)
    highest: Optional[int] = key(None, doc="H: the top block of the search (null: the last)", check=non_negative_int)
    samples: int = key(5, doc="calibration sequences the similarity is measured on", check=positive_int)
    merge: Literal["rdsc", "official_code"] = key(
        "rdsc", doc="rdsc: the paper's Eq. 1; official_code: the notebooks' in-place update (the last block's weights)"
    )


def search_range_fits(config: schema.JobConfig, shape: ModelShape) -> None:
    """Its search range lies within the model's blocks."""
    if config.cuts is None:
        LacoPlan.of(config.selection, shape.num_layers)


METRICS.register("laco", SelectionMetric("laco", "search", search=laco_search, settings=LacoSelectionConfig))
register(
    Method(
        "laco",
        title="LaCo",
        docs="laco.md",
        label=lambda job: "LaCo",
        selections=("laco",),
        search_label="LaCo",
        presets=("laco", "laco_baichuan"),
        check_shape=search_range_fits,
        column_docs={
            "selection_merge_layers": "LaCo (`selection=laco`): C, blocks combined by one merge, as set (null: from "
            "the "
            "depth; `laco_merge_layers` has the value run).",
            "selection_interval": "LaCo: I, how far the search moves down after a kept merge.",
            "selection_threshold": "LaCo: T, a merge is kept when the mean cosine similarity is above it.",
            "selection_lowest": "LaCo: L, the lowest block a merge may start at.",
            "selection_highest": "LaCo: H, the top block of the search as set (null: the last; `laco_highest` as run).",
            "selection_samples": "LaCo: calibration sequences the similarity is measured on.",
            "selection_merge": "LaCo: the merge rule, `rdsc` (the paper's Eq. 1) or `official_code` (the notebooks').",
            "laco_merge_layers": "LaCo: C, blocks combined by one merge, as run (null `merge_layers` resolved from "
            "the depth).",
            "laco_interval": "LaCo: I, the step down after a kept merge.",
            "laco_threshold": "LaCo: T, a merge is kept when the mean cosine similarity is above it.",
            "laco_lowest": "LaCo: L, the lowest block a merge may start at.",
            "laco_highest": "LaCo: H, the top block of the search, as run.",
            "laco_merge": "LaCo: the merge rule, `rdsc` (the paper's Eq. 1) or `official_code` (the notebooks').",
            "laco_samples": "LaCo: calibration sequences the similarity was measured on.",
            "laco_sample_tokens": "LaCo: their tokens.",
            "laco_tries": "JSON: every merge LaCo tried, in order: `start` (the block merged into), `merged` (the "
            "blocks "
            "collapsed, unpruned indices), `similarity`, `accepted`.",
            "laco_merges": "JSON: LaCo's final merges: each kept block `into` and the unpruned `blocks` collapsed "
            "into it.",
            "laco_similarity": "LaCo: the mean cosine similarity of the final merged model with the unpruned one.",
            "laco_target_blocks": "LaCo: blocks asked for (`n_prune`).",
            "laco_removed_blocks": "LaCo: blocks removed (fewer than asked when no further merge stayed above T).",
            "laco_shortfall": "LaCo: `laco_target_blocks - laco_removed_blocks` (0: equal compression reached).",
        },
    )
)
