"""LaCo (Yang, Cao and Zhao, "LaCo: Large Language Model Pruning via Layer Collapse", Findings of
EMNLP 2024; official code yangyifei729/LaCo): a selection by search that collapses runs of
consecutive blocks into the first of each run.

From block ``highest - C`` down to ``lowest``: merge the block at ``l`` with the ``C - 1`` blocks
above it in the current (already collapsed) model (:func:`~replaceme_exp.models.merging.rdsc_merge`),
drop those blocks, and keep the merge when the mean cosine similarity between the merged model's
and the unpruned model's final hidden states (each calibration sequence's whole ``(tokens, hidden)``
output of the last norm, flattened) exceeds ``threshold``; then move down by ``interval``, else by 1.

Equal compression: the search stops once ``n_blocks`` blocks are gone, the last merge shortened to
land on ``n_blocks`` (as the official code shortens a merge at the top of the model). When the
range is exhausted first, fewer blocks go: the row says so (``laco_removed_blocks`` against
``laco_target_blocks``, ``laco_shortfall``) and the log warns; none at all fails the job (a
``ConfigError`` on ``selection.threshold``)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from replaceme_exp.data.batching import TokenBatch, TokenBatches, position_ids_for
from replaceme_exp.errors import ConfigError
from replaceme_exp.models.merging import BlockState, merge_states, mergeable_state, parameters_set
from replaceme_exp.selection.search import SearchContext, SearchResult

log = logging.getLogger(__name__)

# The official notebook for Llama 2 13B (40 blocks) merges C = 7 blocks at a time (6 collapse).
OFFICIAL_COLLAPSED, OFFICIAL_DEPTH = 6, 40


def default_merge_layers(num_layers: int) -> int:
    """C for a model the authors did not prune: as many collapsed blocks per merge, relative to the
    depth, as the official Llama 2 13B setting (6 of 40), rounded half up; at least 2 blocks merged."""
    return max(2, 1 + math.floor(OFFICIAL_COLLAPSED * num_layers / OFFICIAL_DEPTH + 0.5))


@dataclass(frozen=True)
class LacoPlan:
    """The settings as the search runs them on a model of ``num_layers`` blocks (nulls resolved)."""

    merge_layers: int
    interval: int
    threshold: float
    lowest: int
    highest: int
    samples: int
    merge: str

    @classmethod
    def of(cls, settings, num_layers: int) -> LacoPlan:
        highest = num_layers - 1 if settings.highest is None else settings.highest
        if highest > num_layers - 1:
            raise ConfigError("selection.highest", highest, f"the model has blocks 0..{num_layers - 1}")
        if settings.lowest > highest:
            raise ConfigError("selection.lowest", settings.lowest, f"is above selection.highest={highest}")
        merge_layers = settings.merge_layers or default_merge_layers(num_layers)
        return cls(
            merge_layers,
            settings.interval,
            float(settings.threshold),
            settings.lowest,
            highest,
            settings.samples,
            settings.merge,
        )


def calibration_sequences(calibration: TokenBatches, samples: int) -> list[TokenBatch]:
    """The first ``samples`` calibration sequences, each alone and without its padding (the
    official code runs each sentence unpadded): ``(1, tokens)`` batches."""
    sequences: list[TokenBatch] = []
    for batch in calibration:
        if not isinstance(batch, TokenBatch):
            raise ConfigError("selection.metric", "laco", "compares a text model's final hidden states")
        for row in range(batch.input_ids.shape[0]):
            if len(sequences) == samples:
                return sequences
            keep = batch.attention_mask[row].bool()
            ids = batch.input_ids[row][keep][None]
            positions = position_ids_for(batch.attention_mask[row][None])[0][keep][None]
            if batch.position_ids is not None:
                positions = batch.position_ids[row][keep][None]
            sequences.append(TokenBatch(ids, torch.ones_like(ids), positions))
    return sequences


@torch.no_grad()
def final_hidden_states(adapter, sequences: list[TokenBatch]) -> list[torch.Tensor]:
    """Each sequence's final hidden states (after the last norm), ``(tokens, hidden)`` float64 on the CPU."""
    device = adapter.embeddings.weight.device
    return [adapter.forward_batch(s, device)[0][0].double().cpu() for s in sequences]


def mean_cosine(reference: list[torch.Tensor], hidden: list[torch.Tensor]) -> float:
    """LaCo's ``Avg_Cos_Sim``: per sequence, the cosine between the flattened ``(tokens, hidden)``
    outputs of the two models; averaged over sequences."""
    sims = [torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) for a, b in zip(reference, hidden)]
    return float(torch.stack(sims).mean())


@dataclass
class LayerCollapse:
    """The search's model as collapsed so far: the blocks it keeps (``current``, original indices), the
    merged weights of its merged blocks (``states``) and the original blocks collapsed into each
    (``members``); every merge tried (``tries``), the blocks gone (``removed``) and the similarity
    after the last merge kept."""

    adapter: Any
    sequences: list[TokenBatch]
    reference: list[torch.Tensor]  # the unpruned model's final hidden states
    current: list[int]
    states: dict[int, BlockState] = field(default_factory=dict)
    members: dict[int, list[int]] = field(default_factory=dict)
    tries: list[dict] = field(default_factory=list)
    removed: int = 0
    similarity: float | None = None

    def state_of(self, block: int) -> BlockState:
        """The weights of ``block`` in the collapsed model: merged, or the unpruned model's."""
        if block in self.states:
            return self.states[block]
        return mergeable_state(self.adapter.layers[block], self.adapter.merged_modules)

    def try_merge(self, plan: LacoPlan, lay: int, size: int) -> bool:
        """Merge the ``size`` blocks above position ``lay`` into its block and keep the merge when the
        similarity to the unpruned model exceeds the threshold; returns whether it was kept."""
        base, later = self.current[lay], self.current[lay + 1 : lay + 1 + size]
        merged = merge_states(plan.merge, self.state_of(base), [self.state_of(b) for b in later])
        gone = sorted(set(range(self.adapter.num_layers)) - set(self.current) | set(later))
        with parameters_set(self.adapter.layers, {**self.states, base: merged}), self.adapter.without_blocks(gone):
            value = mean_cosine(self.reference, final_hidden_states(self.adapter, self.sequences))
        accepted = value > plan.threshold
        self.tries.append({"start": base, "merged": later, "similarity": value, "accepted": accepted})
        verdict = "kept" if accepted else "not kept"
        log.info("LaCo: merge %s into block %d: similarity %.4f, %s", later, base, value, verdict)
        if accepted:
            self.states[base] = merged
            self.members[base] = self.members.get(base, []) + [m for b in later for m in (b, *self.members.pop(b, []))]
            for b in later:
                self.states.pop(b, None)
            self.current = self.current[: lay + 1] + self.current[lay + 1 + size :]
            self.removed += size
            self.similarity = value
        return accepted


def check_removed(plan: LacoPlan, collapse: LayerCollapse, target: int) -> None:
    """Fail when no merge was kept; warn when fewer than ``target`` blocks went."""
    if collapse.removed == 0:
        best = max((t["similarity"] for t in collapse.tries), default=None)
        span = f"blocks {plan.lowest}..{plan.highest}"
        reason = f"no merge in {span} kept the similarity above it (best {best}): nothing to prune"
        raise ConfigError("selection.threshold", plan.threshold, reason)
    if collapse.removed < target:
        log.warning(
            "LaCo removed %d of the %d blocks asked for: no further merge between blocks %d and %d kept cosine > %s",
            collapse.removed,
            target,
            plan.lowest,
            plan.highest,
            plan.threshold,
        )


def laco_columns(plan: LacoPlan, collapse: LayerCollapse, target: int) -> dict:
    """The row's ``laco_*`` columns: the settings, the calibration sequences, the merges and the shortfall."""
    members, sequences = collapse.members, collapse.sequences
    return {
        "laco_merge_layers": plan.merge_layers,
        "laco_interval": plan.interval,
        "laco_threshold": plan.threshold,
        "laco_lowest": plan.lowest,
        "laco_highest": plan.highest,
        "laco_merge": plan.merge,
        "laco_samples": len(sequences),
        "laco_sample_tokens": sum(s.n_tokens for s in sequences),
        "laco_tries": collapse.tries,
        "laco_merges": [{"into": base, "blocks": sorted(members[base])} for base in sorted(members)],
        "laco_similarity": collapse.similarity,
        "laco_target_blocks": target,
        "laco_removed_blocks": collapse.removed,
        "laco_shortfall": target - collapse.removed,
    }


def laco_search(context: SearchContext) -> SearchResult:
    """LaCo's layer collapse on the unpruned model behind ``context.adapter`` (left as found):
    the removed blocks, the merged weights of the blocks they collapsed into, and every merge tried."""
    adapter, target = context.adapter, context.n_blocks
    plan = LacoPlan.of(context.settings, adapter.num_layers)
    sequences = calibration_sequences(context.calibration, plan.samples)
    reference = final_hidden_states(adapter, sequences)
    collapse = LayerCollapse(adapter, sequences, reference, list(range(adapter.num_layers)))
    lay = plan.highest - plan.merge_layers
    while lay >= plan.lowest and collapse.removed < target:
        size = min(plan.merge_layers - 1, len(collapse.current) - lay - 1, target - collapse.removed)
        if size >= 1 and collapse.try_merge(plan, lay, size):
            lay -= plan.interval
        else:
            lay -= 1
    check_removed(plan, collapse, target)
    removed_blocks = sorted(set(range(adapter.num_layers)) - set(collapse.current))
    states = {b: collapse.states[b] for b in sorted(collapse.states)}
    return SearchResult(removed_blocks, states, laco_columns(plan, collapse, target))
