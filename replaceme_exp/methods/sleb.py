"""SLEB (Song et al., ICML 2024, *SLEB: Streamlining LLMs through Redundancy Verification and
Elimination of Transformer Blocks*; docs/methods/sleb.md): blocks removed one at a time by a greedy
search on the calibration loss, nothing fitted (``experiment=sleb``); its search is
replaceme_exp/selection/sleb.py, kept step by step in the step store."""

from replaceme_exp.config import schema
from replaceme_exp.config.depth import blocks_to_prune
from replaceme_exp.config.schema import Group, SelectionConfig, key, non_negative_int, register_shape
from replaceme_exp.errors import ConfigError
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.models.shape import ModelShape
from replaceme_exp.selection.metrics import METRICS, SelectionMetric
from replaceme_exp.selection.sleb import sleb_search


@register_shape("selection")
@Group
class SlebSelectionConfig(SelectionConfig):
    """``selection=sleb``: the blocks its greedy search never removes, as its official code."""

    early_barrier: int = key(1, doc="the first this many blocks are never removed", check=non_negative_int)
    latter_barrier: int = key(1, doc="the last this many blocks are never removed", check=non_negative_int)


def barriers_leave_room(config: schema.JobConfig, shape: ModelShape) -> None:
    """The blocks to remove fit between the barriers."""
    if config.cuts is not None:
        return
    kept = config.selection.early_barrier + config.selection.latter_barrier
    at_most = shape.num_layers - kept
    if kept > 1 and blocks_to_prune(config.n_prune, shape.num_layers) > at_most:
        reason = f"the model has {shape.num_layers} blocks; at most {at_most} can be removed"
        reason += f" (selection.early_barrier + selection.latter_barrier = {kept} are kept)"
        raise ConfigError("n_prune", config.n_prune, reason)


METRICS.register(
    "sleb",
    SelectionMetric(
        "sleb",
        "search",
        search=sleb_search,
        settings=SlebSelectionConfig,
        fits_after=True,
        stepwise=True,
        text_only=True,
    ),
)
register(
    Method(
        "sleb",
        title="SLEB",
        docs="sleb.md",
        label=lambda job: "SLEB",
        selections=("sleb",),
        search_label="SLEB",
        presets=("sleb",),
        check_shape=barriers_leave_room,
        column_docs={
            "selection_early_barrier": "SLEB (`selection=sleb`): the first blocks it never removes (official: 1).",
            "selection_latter_barrier": "SLEB: the last blocks it never removes (official: 1).",
            "sleb_removal_order": "SLEB: JSON, the removed blocks in the order its greedy search took them out.",
            "sleb_step_ppl": "SLEB: JSON, the calibration perplexity of the model after each step's removal.",
            "sleb_ppl_unpruned": "SLEB: the unpruned model's calibration perplexity (same tokens as `sleb_step_ppl`).",
            "sleb_predictions": "SLEB: the next-token predictions its calibration loss sums over.",
        },
    )
)
