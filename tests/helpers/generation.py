"""What the self-generated calibration tests share: a tiny model whose greedy answers differ by
prompt, and a typed ``source: generated`` calibration option."""

from __future__ import annotations

import torch

from helpers.config import CACHE, typed
from replaceme_exp.config.validate import build_option
from replaceme_exp.models import load_model


def answering_tiny_model():
    """tiny_llama with larger weights than its init, so that greedy answers differ by prompt."""
    loaded = load_model(typed(["model=tiny_llama"]).model, str(CACHE))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in loaded.model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3 if "embed" in name else 0.15)
    return loaded


def generation_option(n_samples: int, generation_batch_size: int, **overrides):
    """A typed ``source: generated`` calibration option: greedy answers of 5 tokens, seed 0, these counts."""
    settings = {"n_samples": n_samples, "max_new_tokens": 5, "generation_batch_size": generation_batch_size}
    settings |= {"temperature": 0.0, "seed": 0, **overrides}
    shape = {"name": "generated", "source": "generated", "seq_len": 256, "batch_size": 8}
    return build_option("calibration", {**shape, **settings}, "calibration")
