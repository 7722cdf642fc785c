"""ShortGPT (Men et al. 2024, "ShortGPT: Layers in Large Language Models are More Redundant Than
You Expect"): the Block Influence of block ``i``,

    BI_i = 1 - mean over calibration tokens of cos(X_i, X_{i+1}),

``X_i`` the input of block ``i`` (``X_0``: the embeddings) and ``X_{i+1}`` its output; the ``n``
blocks of lowest BI are removed, wherever they are (block 0 and the last block too), nothing
fitted. As its official code (icip-cas/ShortGPT, ``shortgpt.py``/``metrics.py``) reads it:

- each sequence runs in windows of ``window`` tokens (its ``stride``, 256), each window a
  sequence of its own (positions from 0, no context from the window before);
- the last block's output is the model's last hidden state after its final norm (what
  ``output_hidden_states`` returns there), with ``final_norm=false`` the block's own output;
- the mean runs over every token of every window (its sum over tokens, divided by their count:
  the same order), padding left out (its one-sequence batches have none); a cosine of a zero
  vector counts 0.5, as its ``nan_to_num(nan=0.5)``.

A selection by search (:mod:`~replaceme_exp.selection.search`): a selection over the capture
hooks could not remove blocks that are not one contiguous cut, nor block 0 (no ``L_{-1}``).
"""

from __future__ import annotations

import torch

from replaceme_exp.data.batching import TokenBatch, TokenBatches
from replaceme_exp.progress import progress
from replaceme_exp.selection.search import SearchContext, SearchResult

ZERO_NORM_COSINE = 0.5  # the official code's nan_to_num(nan=0.5)


def windows(batch: TokenBatch, window: int) -> list[TokenBatch]:
    """``batch`` cut into windows of ``window`` positions, each run as its own sequences (positions
    counted over its mask from its first token); rows with no token in a window are left out."""
    out = []
    for start in range(0, batch.input_ids.shape[1], window):
        mask = batch.attention_mask[:, start : start + window]
        rows = mask.sum(dim=1) > 0
        if rows.any():
            out.append(TokenBatch(batch.input_ids[rows, start : start + window], mask[rows]))
    return out


@torch.inference_mode()
def block_boundaries(adapter, batch: TokenBatch, final_norm: bool) -> list[torch.Tensor]:
    """``[X_0, ..., X_L]`` of one batch, each (batch, seq, hidden): the input of every block (hooks
    before each block), and the last block's output, after the model's final norm (the
    backbone's last hidden state) with ``final_norm``, else as the block returns it."""
    inputs: list[torch.Tensor] = []
    last: list[torch.Tensor] = []

    def before(module, args, kwargs):
        inputs.append(args[0] if args else kwargs["hidden_states"])

    def after(module, args, output):
        last.append(output[0] if isinstance(output, tuple) else output)

    handles = [layer.register_forward_pre_hook(before, with_kwargs=True) for layer in adapter.layers]
    handles.append(adapter.layers[-1].register_forward_hook(after))
    try:
        output = adapter.forward_batch(batch, adapter.embeddings.weight.device)
    finally:
        for handle in handles:
            handle.remove()
    return [*inputs, output.last_hidden_state if final_norm else last[0]]


def token_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row cosine in float64, a zero row's cosine 0.5 (the official code's NaN); (n, d), (n, d) -> (n,)."""
    a, b = a.double(), b.double()
    cos = (a * b).sum(dim=-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return cos.nan_to_num(nan=ZERO_NORM_COSINE)


def block_influence(adapter, calibration: TokenBatches, window: int, final_norm: bool) -> tuple[list[float], int]:
    """Every block's BI over the calibration tokens (module docstring). Returns ([BI_0, ...,
    BI_{L-1}], the number of tokens averaged over)."""
    sums = torch.zeros(adapter.num_layers, dtype=torch.float64)
    count = 0
    for batch in progress(calibration, desc="ShortGPT block influence", unit="batch"):
        for part in windows(batch, window):
            hidden = block_boundaries(adapter, part, final_norm)
            tokens = part.attention_mask.bool().to(hidden[0].device)
            for i in range(adapter.num_layers):
                sums[i] += (1.0 - token_cosines(hidden[i][tokens], hidden[i + 1][tokens])).sum().cpu()
            count += int(tokens.sum())
    return (sums / count).tolist(), count


def shortgpt_search(context: SearchContext) -> SearchResult:
    """The ``n_blocks`` blocks of lowest Block Influence (ties: the earlier block). The row records
    every block's BI (``shortgpt_block_influence``, by block) and the ascending order
    (``shortgpt_order``, the official code's "pruning order")."""
    settings = context.settings
    influence, count = block_influence(context.adapter, context.calibration, settings.window, settings.final_norm)
    order = sorted(range(len(influence)), key=lambda i: (influence[i], i))
    columns = {"shortgpt_block_influence": influence, "shortgpt_order": order, "shortgpt_tokens": count}
    return SearchResult(sorted(order[: context.n_blocks]), columns=columns)
