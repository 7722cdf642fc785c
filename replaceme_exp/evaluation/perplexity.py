"""Perplexity of a causal LM on full windows of held-out text."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from replaceme_exp.data.batching import TokenBatches


@torch.inference_mode()
def perplexity(model, windows: TokenBatches) -> float:
    """``exp`` of the mean next-token negative log-likelihood over all predicted tokens of the
    windows (each window is scored on its own, no context carried across windows)."""
    device = model.get_input_embeddings().weight.device
    nll, count = 0.0, 0
    for batch in tqdm(windows, desc="perplexity", leave=False, disable=None):
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
