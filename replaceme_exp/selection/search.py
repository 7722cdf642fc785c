"""What a selection by search (``SelectionMetric.kind == "search"``: SLEB, LaCo) is given and returns.

A search runs the model itself, with candidate blocks removed or merged, on the calibration
batches, and decides which blocks go. Unlike a selection by distance, its removed blocks need not
form cuts of one length, block 0 may go, and it may leave new weights for blocks it keeps (LaCo
merges later blocks into an earlier one): :class:`SearchResult.block_states`, applied by the
surgery before the blocks are removed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch

from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.selection.cuts import Cut, merge_consecutive_cuts
from replaceme_exp.selection.search_steps import SearchSteps, no_steps
from replaceme_exp.stages import StageCost, stage

# {original block index: {parameter name inside the block: new value}}
BlockStates = dict[int, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class SearchContext:
    """``adapter``: the unpruned model (a search must leave it as it found it); ``calibration``: the
    job's calibration batches; ``n_blocks``: how many blocks to remove (``n_prune`` as blocks);
    ``settings``: the ``selection`` option's typed config (the search's own keys); ``seed``: the job's;
    ``steps``: where a greedy search keeps its finished steps and finds earlier ones
    (:mod:`~replaceme_exp.selection.search_steps`; by default nothing is kept).

    A search runs in stages of kind ``capture`` (:func:`search_stage`): its time and energy are
    compression cost, like a capture's."""

    adapter: Any
    calibration: TokenBatches
    n_blocks: int
    settings: Any
    seed: int
    steps: SearchSteps = field(default_factory=no_steps)


def search_stage(name: str, step: int | None = None) -> ContextManager[StageCost]:
    """The stage of search ``name``'s work: a whole search (opened around it unless the metric
    ``stepwise``), or its ``step``, counted from 1."""
    return stage("capture", f"selection search ({name})" + ("" if step is None else f" step {step}"))


@dataclass
class SearchResult:
    """``removed``: the original indices of the blocks to remove; ``block_states``: new parameter
    values of kept blocks (by original index; empty for a plain removal); ``columns``: what the
    row records of the search (its order, its scores, ...)."""

    removed: list[int]
    block_states: BlockStates = field(default_factory=dict)
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def cuts(self) -> list[Cut]:
        """The removed blocks as cuts: runs of consecutive blocks, sorted."""
        return merge_consecutive_cuts([(i, i + 1) for i in sorted(set(self.removed))])

    def check(self, num_layers: int) -> None:
        """Raise ``ValueError`` for a result no surgery can apply (a search's own bug, not the user's)."""
        removed = set(self.removed)
        if len(removed) != len(self.removed) or not all(0 <= i < num_layers for i in removed):
            raise ValueError(f"a search removed blocks {self.removed} of {num_layers}")
        if len(removed) >= num_layers:
            raise ValueError(f"a search removed all {num_layers} blocks")
        if kept := sorted(set(self.block_states) & removed):
            raise ValueError(f"a search left new weights for blocks {kept} that it removes")
