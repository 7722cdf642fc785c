"""Surgery: fuse each transform into the down-projection before its cut, remove the cut blocks,
re-index what remains, and save a standard checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from replaceme_exp.models.adapters import DecoderAdapter

Cut = tuple[int, int]


@torch.no_grad()
def fuse_transform(adapter: DecoderAdapter, block: int, transform: torch.Tensor) -> None:
    """Make block ``block``'s MLP output ``M T`` instead of ``M``.

    With ``M = x W^T + b`` (``W``: (hidden, intermediate)), ``M T = x (T^T W)^T + T^T b``;
    the product is formed in float64 and cast back to the weight's dtype.
    """
    linear = adapter.fusion_target(block)
    t = transform.to(device=linear.weight.device, dtype=torch.float64)
    linear.weight.copy_((t.T @ linear.weight.double()).to(linear.weight.dtype))
    if linear.bias is not None:
        linear.bias.copy_((t.T @ linear.bias.double()).to(linear.bias.dtype))


def kept_blocks(num_layers: int, cuts: list[Cut]) -> list[int]:
    removed = {i for start, end in cuts for i in range(start, end)}
    return [i for i in range(num_layers) if i not in removed]


def prune(adapter: DecoderAdapter, cuts: list[Cut], transforms: dict[Cut, torch.Tensor | None]) -> list[int]:
    """Apply all cuts in place. Fusion happens in original indices before any block is removed,
    so several cuts need no index bookkeeping. Returns the original indices of the kept blocks."""
    for cut in cuts:
        transform = transforms.get(cut)
        if transform is not None:
            fuse_transform(adapter, cut[0] - 1, transform)
    kept = kept_blocks(adapter.num_layers, cuts)
    adapter.keep_layers(kept)
    return kept


def save_checkpoint(model, tokenizer, path: str | os.PathLike, metadata: dict) -> Path:
    """Save model and tokenizer as safetensors under ``path`` (atomically), with the pruning
    metadata in ``replaceme.json``. Loadable by ``AutoModelForCausalLM.from_pretrained``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".save-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "replaceme.json").write_text(json.dumps(metadata, indent=2, default=str))
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
