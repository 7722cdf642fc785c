"""Random token sequences and the padded batches the capture reads."""

from __future__ import annotations

import torch

from replaceme_exp.data.batching import TokenBatches, pad_sequences


def random_sequences(n: int, min_len: int, max_len: int, vocab: int = 128, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    return [torch.randint(0, vocab, (int(k),), generator=g).tolist() for k in lengths]


def batches_of(sequences: list[list[int]], batch_size: int, side: str = "right") -> TokenBatches:
    return TokenBatches(
        [pad_sequences(sequences[i : i + batch_size], 0, side) for i in range(0, len(sequences), batch_size)],
        max(len(s) for s in sequences),
    )
