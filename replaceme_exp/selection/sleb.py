"""SLEB (Song et al., ICML 2024, "SLEB: Streamlining LLMs through Redundancy Verification and
Elimination of Transformer Blocks"; official code jiwonsong-dev/SLEB, ``sleb.py``): remove one
block at a time, each time the block whose removal leaves the current model with the lowest
calibration loss, until ``n`` are removed; nothing fitted.

As its official code: the candidates are the current model's blocks but the first
``early_barrier`` and the last ``latter_barrier`` (1 and 1: block 0 and the last block are never
removed); the loss is the next-token cross-entropy of the model's logits summed over the
calibration tokens (its sum over windows of the mean per window times the window length: the
same order for windows of one length); ties go to the earlier block (its strict ``<``). Here the
tokens are every next-token prediction within a sequence (target and the token before it not
padding), and the row records each step's calibration perplexity, ``exp`` of the mean NLL.

Exact and cheaper than the official loop (``n x L`` full forward passes): per batch, one pass of
the current model keeps every block's input; the candidate without block ``p`` then runs from
block ``p``'s input through the blocks after it and the head only (block ``p`` stands in
returning its input; the blocks before it are taken out), with the model's own masks and
positions. Per step that is about half the block passes of the naive loop, with one batch's
hidden states held at a time.

Each step is a stage of its own (``selection search (sleb) step k``) and is kept with what it
cost in the job's step store (:mod:`~replaceme_exp.selection.search_steps`): a killed search
resumes at its next step, and a search for more blocks on the same model, data and barriers
starts from the steps a search for fewer already took. The row then counts the reused steps and
adds their cost (:func:`~replaceme_exp.selection.search_steps.reused_columns`).
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F

from replaceme_exp.data.batching import TokenBatch, TokenBatches, position_ids_for
from replaceme_exp.progress import progress
from replaceme_exp.selection.search import SearchContext, SearchResult, search_stage
from replaceme_exp.selection.search_steps import StepKey, reused_columns
from replaceme_exp.stages import StageCost

log = logging.getLogger(__name__)

Losses = tuple[dict[int, float], float, int]  # {candidate: NLL without it}, NLL now, predictions
# What a step computes (the removal losses of every candidate): bump when the code changes it, so that
# the steps kept in the step store by earlier code are recomputed.
STEP_VERSION = 1


def logits_of(adapter, batch: TokenBatch) -> torch.Tensor:
    """The model's next-token logits on ``batch``, (batch, seq, vocab)."""
    device = adapter.embeddings.weight.device
    mask = batch.attention_mask.to(device)
    positions = batch.position_ids.to(device) if batch.position_ids is not None else position_ids_for(mask)
    ids = batch.input_ids.to(device)
    return adapter.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits


def next_token_nll(logits: torch.Tensor, batch: TokenBatch) -> tuple[float, int]:
    """Summed next-token negative log-likelihood in float32 over the predictions whose target and
    context token are both tokens (not padding). Returns (sum, number of predictions)."""
    ids, mask = batch.input_ids.to(logits.device), batch.attention_mask.to(logits.device).bool()
    scored = mask[:, 1:] & mask[:, :-1]
    predicted = logits[:, :-1][scored].float()
    return float(F.cross_entropy(predicted, ids[:, 1:][scored], reduction="sum")), int(scored.sum())


@contextmanager
def standing_in(block: torch.nn.Module, hidden: torch.Tensor, returns_tuple: bool) -> Iterator[None]:
    """``block`` returns ``hidden`` (as the block returns its output) instead of computing."""
    value = (hidden,) if returns_tuple else hidden
    block.forward = lambda *args, **kwargs: value  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        block.__dict__.pop("forward", None)


@torch.inference_mode()
def removal_losses(adapter, calibration: TokenBatches, candidates: list[int]) -> Losses:
    """The summed calibration NLL of the current model without each candidate block (current
    indices), and of the current model itself. Returns ({candidate: NLL}, NLL now, predictions)."""
    losses = dict.fromkeys(candidates, 0.0)
    current, count = 0.0, 0
    inputs: list[torch.Tensor] = []  # the current batch's input of each block
    returns: list[bool] = []  # whether a block returns a tuple

    def before(module, args, kwargs):
        inputs.append(args[0] if args else kwargs["hidden_states"])

    def after(module, args, output):
        returns.append(isinstance(output, tuple))

    for batch in progress(calibration, desc="SLEB candidates", unit="batch"):
        inputs.clear()
        returns.clear()
        handles = [layer.register_forward_pre_hook(before, with_kwargs=True) for layer in adapter.layers]
        handles.append(adapter.layers[0].register_forward_hook(after))
        try:
            nll, n = next_token_nll(logits_of(adapter, batch), batch)
        finally:
            for handle in handles:
                handle.remove()
        current += nll
        count += n
        for p in candidates:
            with adapter.without_blocks(range(p)):  # block p first, the blocks before it out
                with standing_in(adapter.layers[0], inputs[p], returns[0]):
                    losses[p] += next_token_nll(logits_of(adapter, batch), batch)[0]
    return losses, current, count


def stored_losses(stored, candidates: int) -> bool:
    """Whether a stored step holds what :func:`step_losses` keeps for ``candidates`` candidates."""
    numbers = (int, float)
    return (
        isinstance(stored, dict)
        and isinstance(stored.get("losses"), list)
        and len(stored["losses"]) == candidates
        and all(isinstance(v, numbers) for v in stored["losses"])
        and isinstance(stored.get("current"), numbers)
        and isinstance(stored.get("count"), int)
    )


def step_losses(context: SearchContext, alive: list[int], order: list[int]) -> tuple[Losses, StageCost | None]:
    """The next step's :func:`removal_losses` for the model of blocks ``alive`` (``order``: those
    removed so far), from the step store when an earlier job took this step, else computed in a
    stage of its own and stored. Returns (what :func:`removal_losses` returns, what the step cost
    when it was taken from the store, else None)."""
    settings, adapter = context.settings, context.adapter
    candidates = list(range(settings.early_barrier, len(alive) - settings.latter_barrier))
    if not candidates:
        raise ValueError(f"SLEB has no candidate left among {len(alive)} blocks")
    barriers = {"early_barrier": settings.early_barrier, "latter_barrier": settings.latter_barrier}
    step = StepKey("sleb", STEP_VERSION, barriers, tuple(order))
    if (found := context.steps.get(step, lambda stored: stored_losses(stored, len(candidates)))) is not None:
        stored, cost = found
        log.info("SLEB step %d found in the step store", len(order) + 1)
        return (dict(zip(candidates, stored["losses"], strict=True)), stored["current"], stored["count"]), cost
    with search_stage("sleb", len(order) + 1) as cost:
        with adapter.without_blocks([i for i in range(adapter.num_layers) if i not in alive]):
            losses, current, count = removal_losses(adapter, context.calibration, candidates)
    context.steps.put(step, {"losses": [losses[p] for p in candidates], "current": current, "count": count}, cost)
    return (losses, current, count), None


def sleb_search(context: SearchContext) -> SearchResult:
    """The greedy removal (module docstring). The row records the removal order
    (``sleb_removal_order``, original indices), each step's calibration perplexity after that
    removal (``sleb_step_ppl``), the unpruned model's (``sleb_ppl_unpruned``), and the steps taken
    from the step store with their cost (:func:`reused_columns`)."""
    adapter = context.adapter
    alive = list(range(adapter.num_layers))
    order: list[int] = []
    step_ppl: list[float] = []
    unpruned, count = None, None
    reused: list[StageCost] = []
    for _ in range(context.n_blocks):
        (losses, current, count), cost = step_losses(context, alive, order)
        reused += [cost] if cost is not None else []
        candidates = sorted(losses)
        unpruned = math.exp(current / count) if unpruned is None else unpruned
        best = min(candidates, key=lambda p: (losses[p], p))
        order.append(alive.pop(best))
        step_ppl.append(math.exp(losses[best] / count))
        log.info("SLEB step %d: block %d out, calibration perplexity %.4g", len(order), order[-1], step_ppl[-1])
    columns = {
        "sleb_removal_order": order,
        "sleb_step_ppl": step_ppl,
        "sleb_ppl_unpruned": unpruned,
        "sleb_predictions": count,
        **reused_columns(reused),
    }
    return SearchResult(order, columns=columns)
