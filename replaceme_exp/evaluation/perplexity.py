"""Perplexity of a causal LM on full windows of held-out text."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.progress import progress


@torch.inference_mode()
def perplexity(model, windows: TokenBatches) -> float:
    """``exp`` of the mean next-token negative log-likelihood over all predicted tokens of the
    windows (each window is scored on its own, no context carried across windows).

    Only positions 1.. of a window are predicted, so the first token, the BOS that
    :func:`~replaceme_exp.data.batching.pack_windows` puts there when the tokenizer has one, is
    context and never a target: with a BOS each window scores its ``seq_len - 1`` text tokens,
    and every text token of the windows is scored exactly once. (A BOS id inside the stream, e.g.
    a tokenizer whose BOS is also its EOS separator, is text and counts.)

    ``ppl_heldout`` is this per-token perplexity over fixed windows of held-out pydoc text
    (``eval.seq_len`` tokens, ``eval.max_windows`` of them, BOS-prefixed). It is not comparable
    in value with lm-eval's perplexities: ``word_perplexity`` (``ppl_pydoc`` of ``eval=offline``)
    is ``exp`` of the total NLL divided by the number of *words*, summed per document over
    rolling windows of the model's full ``max_length`` (more context per token, and a per-word
    rather than per-token normalisation, so it moves with the tokenizer's granularity), and
    lambada's ``perplexity`` (``ppl_lambada``) is ``exp`` of the mean NLL of the *last word* of
    each passage given the whole passage before it.
    """
    device = model.get_input_embeddings().weight.device
    nll, count = 0.0, 0
    for batch in progress(windows, desc="perplexity", unit="batch"):
        ids = batch.input_ids.to(device)
        mask = batch.attention_mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
        # With device_map=auto the logits may live on another GPU than the inputs.
        targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100).to(logits.device)
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum", ignore_index=-100
        )
        nll += float(loss)
        count += int((targets != -100).sum())
    return math.exp(nll / count)
