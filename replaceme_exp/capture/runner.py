"""The capture loop: hooks on blocks and MLPs, padding dropped, early stop after the last block
that any statistic needs."""

from __future__ import annotations

import logging

import torch

from replaceme_exp.capture.statistics import ActKey, BatchTokens
from replaceme_exp.data.batching import TokenBatch, TokenBatches
from replaceme_exp.models.adapters import DecoderAdapter
from replaceme_exp.progress import progress

log = logging.getLogger(__name__)


class _StopForward(Exception):
    """Raised in the hook of the last needed block to skip the rest of the model."""


def position_ids_for(mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over non-padding tokens, so left padding does not shift RoPE."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def input_device(adapter: DecoderAdapter) -> torch.device:
    return adapter.embeddings.weight.device


def _backbone_forward(adapter: DecoderAdapter, batch: TokenBatch):
    device = input_device(adapter)
    mask = batch.attention_mask.to(device)
    positions = batch.position_ids.to(device) if batch.position_ids is not None else position_ids_for(mask)
    return adapter.backbone(
        input_ids=batch.input_ids.to(device),
        attention_mask=mask,
        position_ids=positions,
        use_cache=False,
    )


@torch.inference_mode()
def plain_forward(adapter: DecoderAdapter, batches: TokenBatches) -> None:
    """All blocks, no hooks, nothing kept: the reference for capture overhead."""
    for batch in batches:
        _backbone_forward(adapter, batch)


@torch.inference_mode()
def run_capture(adapter: DecoderAdapter, batches: TokenBatches, statistics: list, desc: str = "capture") -> int:
    """Stream ``batches`` through the model, feeding every statistic's requests.

    Returns the number of blocks each batch ran through (the pass stops after the last block
    whose output or MLP output some statistic needs).
    """
    requests = [req for stat in statistics for req in stat.requests()]
    if not requests:
        return 0
    needed: dict[ActKey, int] = {}
    for keys, _ in requests:
        for key in keys:
            needed[key] = needed.get(key, 0) + 1
    last_block = max(k for _, k in needed)
    if last_block >= adapter.num_layers or min(k for _, k in needed) < 0:
        raise ValueError(f"capture needs blocks outside 0..{adapter.num_layers - 1}: {sorted(needed)}")

    state: dict = {}

    def on_activation(key: ActKey, output: torch.Tensor) -> None:
        if key not in needed:
            return
        mask = state["mask"]
        state["acts"][key] = output[mask.to(output.device)].to(mask.device)
        state["available"].add(key)
        remaining = state["remaining"]
        for i in list(state["pending"]):
            keys, update = requests[i]
            if all(k in state["available"] for k in keys):
                update(state["acts"], state["tokens"])
                state["pending"].discard(i)
                for k in keys:
                    remaining[k] -= 1
                    if remaining[k] == 0:
                        del state["acts"][k]

    def block_hook(index: int):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            on_activation(("L", index), out)
            if index == last_block:
                raise _StopForward

        return hook

    def mlp_hook(index: int):
        def hook(module, args, output):
            on_activation(("M", index), output)

        return hook

    handles = []
    try:
        for kind, index in needed:
            if kind == "M":
                handles.append(adapter.mlp(index).register_forward_hook(mlp_hook(index)))
        for index in sorted({k for _, k in needed} | {last_block}):
            handles.append(adapter.layers[index].register_forward_hook(block_hook(index)))
        for batch in progress(batches, desc=desc, unit="batch"):
            mask = batch.attention_mask.bool().to(input_device(adapter))
            lengths = mask.sum(-1)
            positions = batch.position_ids.to(mask.device) if batch.position_ids is not None else position_ids_for(mask)
            state.update(
                mask=mask,
                acts={},
                available=set(),
                pending=set(range(len(requests))),
                remaining=dict(needed),
                tokens=BatchTokens(int(lengths.sum()), lengths.cumsum(0) - 1, positions[mask]),
            )
            try:
                _backbone_forward(adapter, batch)
            except _StopForward:
                pass
            if state["pending"]:
                raise RuntimeError(f"capture requests never completed: {sorted(state['pending'])}")
    finally:
        for handle in handles:
            handle.remove()
        state.clear()
    return last_block + 1
