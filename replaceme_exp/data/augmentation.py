"""Random token masking as data augmentation of the calibration set (the paper's low-data ablation).

Each masked copy of a calibration sequence hides a random fraction of its tokens from the
attention of every other token (their key columns are masked, as padding is) while the visible
tokens keep their original positions. The hidden tokens leave the statistics like padding, and
the visible ones see a different context, so the captured (M, L - Y) pairs differ from those of
the plain pass: new data, not a smaller batch. The first token of each sequence (the attention
sink, BOS) is never hidden. The augmented set is the plain sequences followed by ``passes``
masked copies, drawn from a generator seeded by ``seed``.
"""

from __future__ import annotations

import torch

from replaceme_exp.data.batching import TokenBatch, TokenBatches
from replaceme_exp.errors import ConfigError


def masked_copy(batch: TokenBatch, ratio: float, generator: torch.Generator) -> TokenBatch:
    """``batch`` with a fraction ``ratio`` of each sequence's non-padding tokens (never its first)
    masked out; positions are those of the unmasked sequence. Shapes as in ``batch``."""
    mask = batch.attention_mask.bool()
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    first = mask & (positions == 0)
    drop = (torch.rand(mask.shape, generator=generator) < ratio) & mask & ~first
    return TokenBatch(batch.input_ids.clone(), (mask & ~drop).long(), positions)


def with_masked_copies(batches: TokenBatches, ratio: float, passes: int, seed: int) -> TokenBatches:
    """The plain batches followed by ``passes`` masked copies of each (``ratio`` in (0, 1))."""
    if not 0.0 < ratio < 1.0:
        raise ConfigError("mask_ratio", ratio, "must be in (0, 1) for masked copies (0 = no masking)")
    if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
        raise ConfigError("mask_passes", passes, "must be a positive integer (masked copies of the calibration set)")
    generator = torch.Generator().manual_seed(int(seed))
    copies = [masked_copy(b, ratio, generator) for _ in range(passes) for b in batches]
    return TokenBatches(list(batches) + copies, batches.seq_len)
