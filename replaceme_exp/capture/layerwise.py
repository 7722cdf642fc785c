"""Layer-wise capture: the model stays where it was loaded (host memory), one block at a time
moves to the compute device, runs over every calibration batch, and moves back (the pattern of
wanda, SliceGPT and LLM-Drop). The inputs of the next block wait in a :class:`BlockInputs`
store on the GPU, in pinned host memory or on disk.

What each block receives is caught once per batch by running the model with every block
replaced by a recorder: the embedding output (block 0's input) and, per block, the other
arguments the model passes it (attention mask, rotary embeddings, positions; they differ per
block in Gemma 2/3, whose blocks alternate sliding and full attention). The blocks then run
with exactly those arguments, and the hooks of :mod:`replaceme_exp.capture.hooks` see the same
outputs as in a whole-model pass.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path

import torch

from replaceme_exp.capture.execution import CaptureExecution, StoreLayout, choose_store_layout
from replaceme_exp.capture.hooks import BatchCapture, CaptureRequests, backbone_forward, register_capture_hooks
from replaceme_exp.data.batching import TokenBatch, TokenBatches
from replaceme_exp.models.adapters import DecoderAdapter
from replaceme_exp.progress import progress

log = logging.getLogger(__name__)


class _Caught(Exception):
    """Raised by the recorder of the last needed block: the rest of the model is not run."""


def _move(value, device: torch.device, memo: dict):
    """``value`` (tensors inside tuples, lists and dicts) on ``device``; a tensor seen before
    (blocks share their mask and rotary embeddings) is moved once."""
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if id(value) not in memo:
            memo[id(value)] = value.to(device, non_blocking=True)
        return memo[id(value)]
    if isinstance(value, tuple):
        return tuple(_move(v, device, memo) for v in value)
    if isinstance(value, list):
        return [_move(v, device, memo) for v in value]
    if isinstance(value, dict):
        return {k: _move(v, device, memo) for k, v in value.items()}
    return value


def catch_block_inputs(adapter: DecoderAdapter, batch: TokenBatch, last_block: int):
    """Run the model's embedding, masks and rotary embeddings on ``batch`` with blocks
    ``0..last_block`` replaced by recorders (no block computes; their own hooks are set aside).

    Returns ``(hidden, calls)``: block 0's input (batch, seq, hidden) and, for each block
    ``k <= last_block``, ``calls[k] = (args, kwargs)``, what the model passes it besides the
    hidden states.
    """
    calls: list[tuple[tuple, dict]] = []
    first: dict[str, torch.Tensor] = {}

    def recorder(*args, **kwargs):
        hidden = args[0] if args else kwargs.pop("hidden_states")
        if not calls:
            first["hidden"] = hidden
        calls.append((args[1:], kwargs))
        if len(calls) > last_block:
            raise _Caught
        return (hidden,)  # unpacked as ``outputs[0]`` by Falcon; other models pass it on unused

    layers = list(adapter.layers[: last_block + 1])
    saved = [(layer._forward_hooks, layer._forward_pre_hooks) for layer in layers]
    try:
        for layer in layers:
            layer.forward = recorder  # an instance attribute shadows the class's forward
            layer._forward_hooks, layer._forward_pre_hooks = OrderedDict(), OrderedDict()
        try:
            backbone_forward(adapter, batch)
        except _Caught:
            pass
    finally:
        for layer, (hooks, pre_hooks) in zip(layers, saved):
            layer.__dict__.pop("forward", None)
            layer._forward_hooks, layer._forward_pre_hooks = hooks, pre_hooks
    if len(calls) != last_block + 1:
        raise RuntimeError(f"the model called {len(calls)} of the {last_block + 1} blocks a layer-wise capture needs")
    return first["hidden"], calls


class BlockInputs:
    """The hidden states waiting for the next block, one (batch, seq, hidden) tensor per batch,
    on the compute device (``gpu``), in pinned host memory (``cpu``) or in memory-mapped files
    under ``directory`` (``disk``)."""

    def __init__(self, location: str, device: torch.device, directory: str | os.PathLike | None = None):
        self.location, self.device = location, device
        self.tensors: dict[int, torch.Tensor] = {}
        self._tmpdir = None
        if location == "disk":
            self._tmpdir = tempfile.TemporaryDirectory(prefix="layerwise-inputs-", dir=directory)

    def put(self, index: int, hidden: torch.Tensor) -> None:
        if self.location == "gpu":
            self.tensors[index] = hidden.to(self.device)
            return
        if self.location == "cpu":
            on_host = hidden.to("cpu")
            self.tensors[index] = on_host.pin_memory() if torch.cuda.is_available() else on_host
            return
        if index not in self.tensors:  # one file per batch, overwritten block after block
            path = Path(self._tmpdir.name) / f"batch-{index}.bin"
            stored = torch.from_file(str(path), shared=True, size=hidden.numel(), dtype=hidden.dtype)
            self.tensors[index] = stored.view(hidden.shape)
        self.tensors[index].copy_(hidden)

    def get(self, index: int) -> torch.Tensor:
        return self.tensors[index].to(self.device, non_blocking=True)

    def close(self) -> None:
        self.tensors.clear()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()


def _block_device(block: torch.nn.Module) -> torch.device:
    return next(block.parameters()).device


def _place(block: torch.nn.Module, device: torch.device) -> None:
    """Move ``block``'s weights; outside inference mode, so the moved weights stay ordinary
    tensors that healing can later train."""
    with torch.inference_mode(False):
        block.to(device)


def run_layerwise(
    adapter: DecoderAdapter, batches: TokenBatches, plan: CaptureRequests, execution: CaptureExecution, desc: str
) -> StoreLayout:
    """Feed ``plan``'s requests block by block (see the module docstring). Batches are taken in
    chunks of the layout's ``chunk_batches`` (all at once unless the kept activations would not
    fit); each chunk runs blocks ``0..plan.last_block``. Returns the layout used."""
    batches = list(batches)
    dtype = next(adapter.layers[0].parameters()).dtype
    itemsize = torch.tensor([], dtype=dtype).element_size()
    hidden = adapter.hidden_size
    layout = choose_store_layout(
        execution,
        hidden_bytes=[b.attention_mask.numel() * hidden * itemsize for b in batches],
        kept_bytes=[plan.live_keys_peak() * b.n_tokens * hidden * itemsize for b in batches],
    )
    log.info("layer-wise %s on %s: %s", desc, execution.device, layout.reason)
    for lo in range(0, len(batches), layout.chunk_batches):
        _run_chunk(adapter, batches[lo : lo + layout.chunk_batches], plan, execution, layout, desc)
    return layout


def _run_chunk(adapter, batches, plan, execution, layout, desc) -> None:
    device = execution.device
    keep = device if layout.location == "gpu" else torch.device("cpu")
    inputs = BlockInputs(layout.location, device, execution.directory)
    calls, captures = [], []
    try:
        for i, batch in enumerate(batches):
            first, batch_calls = catch_block_inputs(adapter, batch, plan.last_block)
            memo: dict = {}
            inputs.put(i, first)
            calls.append(_move(batch_calls, device, memo) if layout.location == "gpu" else batch_calls)
            captures.append(BatchCapture(plan, batch, device, keep_device=keep))
        current: dict[str, BatchCapture] = {}
        handles = register_capture_hooks(
            adapter, plan, lambda: current["batch"], stop_after_last=False, last_state=execution.last_state
        )
        try:
            for k in progress(range(plan.last_block + 1), desc=desc, unit="block"):
                block = adapter.layers[k]
                home = _block_device(block)
                _place(block, device)
                try:
                    for i in range(len(batches)):
                        current["batch"] = captures[i]
                        args, kwargs = _move(calls[i][k], device, {})
                        output = block(inputs.get(i), *args, **kwargs)
                        if k < plan.last_block:
                            inputs.put(i, output[0] if isinstance(output, tuple) else output)
                finally:
                    _place(block, home)
        finally:
            for handle in handles:
                handle.remove()
        for capture in captures:
            capture.check_complete()
    finally:
        inputs.close()
