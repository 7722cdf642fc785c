"""The hooks of a capture: on blocks and MLPs, padding dropped, each statistic's requests fed as
soon as the activations they need exist, and an early stop after the last block any statistic
needs. Whole-model and layer-wise captures (:mod:`replaceme_exp.capture.runner`) share them."""

from __future__ import annotations

import copy
import logging
from typing import Callable

import torch

from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.capture.statistics import ActKey, BatchTokens
from replaceme_exp.data.batching import TokenBatch, position_ids_for
from replaceme_exp.models.adapters import DecoderAdapter

log = logging.getLogger(__name__)


class StopForward(Exception):
    """Raised in the hook of the last needed block to skip the rest of the model."""


def embedding_device(adapter: DecoderAdapter) -> torch.device:
    """Where a batch's input ids go."""
    return adapter.embeddings.weight.device


def input_device(adapter: DecoderAdapter, execution: CaptureExecution | None = None) -> torch.device:
    """Where captured activations are consumed and statistics accumulate under the capture plan
    ``execution`` (None: whole-model): the embeddings' device, or the compute device of a layer-wise
    capture."""
    if execution is not None and execution.mode == "layerwise":
        return execution.device
    return embedding_device(adapter)


def backbone_forward(adapter: DecoderAdapter, batch: TokenBatch):
    return adapter.forward_batch(batch, embedding_device(adapter))


class CaptureRequests:
    """The statistics' requests of one capture: which activations (``("L", k)`` / ``("M", k)``)
    are needed, by how many requests each, and the last block any of them needs."""

    def __init__(self, statistics: list, num_layers: int):
        pairs = [(req, stat.takes_padding) for stat in statistics for req in stat.requests()]
        self.requests = [req for req, _ in pairs]
        # which requests also take the padded positions' rows (appended after the tokens' rows)
        self.padded = [padded for _, padded in pairs]
        self.padded_keys = {key for (keys, _), padded in zip(self.requests, self.padded) if padded for key in keys}
        self.needed: dict[ActKey, int] = {}
        for keys, _ in self.requests:
            for key in keys:
                self.needed[key] = self.needed.get(key, 0) + 1
        if self.requests:
            blocks = [k for _, k in self.needed]
            if max(blocks) >= num_layers or min(blocks) < 0:
                raise ValueError(f"capture needs blocks outside 0..{num_layers - 1}: {sorted(self.needed)}")
        self.last_block = max((k for _, k in self.needed), default=-1)

    def live_keys_peak(self) -> int:
        """The most activations kept at once for one batch while blocks run in order: a key lives
        from its block until the last block of the requests that use it."""
        until = {key: max(k for keys, _ in self.requests if key in keys for _, k in keys) for key in self.needed}
        live = [sum(1 for (_, b), end in until.items() if b <= k <= end) for k in range(self.last_block + 1)]
        return max(live, default=0)


class BatchCapture:
    """One batch's capture state: its token bookkeeping, the activations kept until every request
    that needs them has run, and the requests still pending.

    Activations are flattened to the non-padding tokens, (n_tokens, hidden); a statistic that
    ``takes_padding`` gets the padded positions' rows after them (``n_tokens`` counts both,
    ``last_rows`` still index the sequences' last tokens). They are kept on
    ``keep_device`` and handed to the updates on ``compute_device`` (the same device in a
    whole-model capture; host memory and the GPU in a layer-wise capture that keeps them off it).
    """

    def __init__(self, plan: CaptureRequests, batch: TokenBatch, compute_device, keep_device=None):
        self.plan, self.compute_device = plan, torch.device(compute_device)
        self.keep_device = torch.device(keep_device) if keep_device is not None else self.compute_device
        self.mask = batch.attention_mask.bool().to(self.compute_device)
        lengths = self.mask.sum(-1)
        positions = (
            batch.position_ids.to(self.compute_device)
            if batch.position_ids is not None
            else position_ids_for(self.mask)
        )
        self.tokens = BatchTokens(int(lengths.sum()), lengths.cumsum(0) - 1, positions[self.mask])
        self.padded_tokens = self.tokens
        if plan.padded_keys:
            n_padded = int((~self.mask).sum())
            all_positions = torch.cat([positions[self.mask], positions[~self.mask]])
            self.padded_tokens = BatchTokens(self.tokens.n_tokens + n_padded, self.tokens.last_rows, all_positions)
        self.acts: dict[ActKey, torch.Tensor] = {}
        self.padding: dict[ActKey, torch.Tensor] = {}  # the padded positions' rows, for padded requests
        self.pending = set(range(len(plan.requests)))
        self.remaining = dict(plan.needed)

    def on_activation(self, key: ActKey, output: torch.Tensor) -> None:
        if key not in self.plan.needed:
            return
        # boolean indexing copies: a block may change the hooked tensor in place afterwards (Falcon)
        mask = self.mask.to(output.device)
        self.acts[key] = self._kept(output[mask])
        if key in self.plan.padded_keys:
            self.padding[key] = self._kept(output[~mask])
        for i in sorted(self.pending):
            keys, update = self.plan.requests[i]
            if all(k in self.acts for k in keys):
                if self.plan.padded[i]:
                    acts = {k: torch.cat([self.acts[k], self.padding[k]]).to(self.compute_device) for k in keys}
                    update(acts, self.padded_tokens)
                else:
                    update({k: self.acts[k].to(self.compute_device, non_blocking=True) for k in keys}, self.tokens)
                self.pending.discard(i)
                for k in keys:
                    self.remaining[k] -= 1
                    if self.remaining[k] == 0:
                        del self.acts[k]
                        self.padding.pop(k, None)

    def _kept(self, rows: torch.Tensor) -> torch.Tensor:
        pin = self.keep_device.type == "cpu" and rows.device.type == "cuda"
        return rows.to(self.keep_device).pin_memory() if pin else rows.to(self.keep_device)

    def check_complete(self) -> None:
        if self.pending:
            raise RuntimeError(f"capture requests never completed: {sorted(self.pending)}")


LAST_STATES = ("block_output", "final_norm")


def last_state_map(adapter: DecoderAdapter, last_state: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What turns the last block's output into the state the capture hands on under ``last_state``
    (``capture.last_state``): None for ``block_output``, and for ``final_norm`` where the family has
    no norm before its last hidden state; else the model's final norm, run where the output is (a
    copy of the norm on the compute device of a layer-wise capture, whose weights stay in host
    memory)."""
    if last_state not in LAST_STATES:
        raise ValueError(f"capture.last_state={last_state!r}: choose one of {LAST_STATES}")
    norm = adapter.final_norm if last_state == "final_norm" else None
    if norm is None:
        return None
    copies: dict[torch.device, torch.nn.Module] = {}

    def normed(hidden: torch.Tensor) -> torch.Tensor:
        weight = next(norm.parameters(), None)
        if weight is None or weight.device == hidden.device or hasattr(norm, "_hf_hook"):
            return norm(hidden)  # accelerate's hook moves the input to a dispatched norm's device
        if hidden.device not in copies:
            copies[hidden.device] = copy.deepcopy(norm).to(hidden.device)
        return copies[hidden.device](hidden)

    return normed


def register_capture_hooks(
    adapter: DecoderAdapter, plan: CaptureRequests, current, stop_after_last: bool, last_state: str = "block_output"
) -> list:
    """Forward hooks on the needed blocks and MLPs feeding ``current()`` (the batch being run).
    With ``stop_after_last`` the last needed block's hook ends the forward pass. The last block's
    ``("L", k)`` is its output as ``last_state`` says (:func:`last_state_map`). Returns handles."""
    final = last_state_map(adapter, last_state)
    last = adapter.num_layers - 1

    def block_hook(index: int):
        def hook(module, args, output):
            state = output[0] if isinstance(output, tuple) else output
            current().on_activation(("L", index), final(state) if final is not None and index == last else state)
            if stop_after_last and index == plan.last_block:
                raise StopForward

        return hook

    def mlp_hook(index: int):
        def hook(module, args, output):
            current().on_activation(("M", index), output)

        return hook

    handles = []
    for kind, index in plan.needed:
        if kind == "M":
            handles.append(adapter.mlp(index).register_forward_hook(mlp_hook(index)))
    for index in sorted({k for _, k in plan.needed} | {plan.last_block}):
        handles.append(adapter.layers[index].register_forward_hook(block_hook(index)))
    return handles
