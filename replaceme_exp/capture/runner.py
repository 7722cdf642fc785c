"""The capture loop. Two ways to run the model over the batches, one result:

- whole-model (the default): each batch runs through the model as it is placed (one device, or
  spread by ``device_map``);
- layer-wise (a capture plan of ``mode == "layerwise"``, :mod:`replaceme_exp.capture.layerwise`):
  the model stays in host memory, one block at a time runs on the compute device over every batch.

Either way the same hooks (:mod:`replaceme_exp.capture.hooks`) fire on the same block outputs and
each statistic sees its batches in the same order, so statistics, distances and transforms agree.

A job run by several processes (:mod:`replaceme_exp.capture.distributed`) splits a shared capture's
batches over them and merges the statistics afterwards (:mod:`replaceme_exp.capture.merge`).
"""

from __future__ import annotations

import torch

from replaceme_exp.capture import distributed
from replaceme_exp.capture.accumulator import Accumulator
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.capture.hooks import (
    BatchCapture,
    CaptureRequests,
    StopForward,
    backbone_forward,
    input_device,
    register_capture_hooks,
)
from replaceme_exp.capture.layerwise import run_layerwise
from replaceme_exp.capture.merge import capture_shared
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.models.adapters import DecoderAdapter
from replaceme_exp.progress import progress
from replaceme_exp.stages import stage


@torch.inference_mode()
def plain_forward(adapter: DecoderAdapter, batches: TokenBatches) -> None:
    """All blocks, no hooks, nothing kept: the reference for capture overhead."""
    for batch in batches:
        backbone_forward(adapter, batch)


@torch.inference_mode()
def run_capture(
    adapter: DecoderAdapter,
    batches: TokenBatches,
    statistics: list,
    desc: str = "capture",
    execution: CaptureExecution | None = None,
) -> int:
    """Stream ``batches`` through the model, feeding every statistic's requests, whole-model or
    layer-wise as the capture plan ``execution`` says (None: whole-model), the last block's state
    as its ``last_state`` says (None: the block's output).

    Returns the number of blocks each batch ran through (the pass stops after the last block
    whose output or MLP output some statistic needs).

    In a capture shared by several ranks (:func:`~replaceme_exp.capture.distributed.sharing`) this
    rank runs its block of consecutive batches, then every statistic is merged across the ranks.
    """
    if distributed.shared() is None:
        return _capture(adapter, batches, statistics, desc, execution)
    return capture_shared(
        batches, statistics, lambda mine, label: _capture(adapter, mine, statistics, label, execution), desc
    )


def _capture(adapter, batches: TokenBatches, statistics: list, desc: str, execution: CaptureExecution | None) -> int:
    """:func:`run_capture` over every batch of ``batches`` in this process."""
    plan = CaptureRequests(statistics, adapter.num_layers)
    if not plan.requests:
        return 0
    if execution is not None and execution.mode == "layerwise":
        run_layerwise(adapter, batches, plan, execution, desc)
        return plan.last_block + 1
    state: dict[str, BatchCapture] = {}
    last_state = execution.last_state if execution is not None else "block_output"
    handles = register_capture_hooks(adapter, plan, lambda: state["batch"], stop_after_last=True, last_state=last_state)
    try:
        for batch in progress(batches, desc=desc, unit="batch"):
            state["batch"] = BatchCapture(plan, batch, input_device(adapter))
            try:
                backbone_forward(adapter, batch)
            except StopForward:
                pass
            state["batch"].check_complete()
    finally:
        for handle in handles:
            handle.remove()
        state.clear()
    return plan.last_block + 1


def gather(
    adapter: DecoderAdapter,
    batches: TokenBatches,
    accumulators: list[Accumulator],
    cache: StatisticsCache | None = None,
    execution: CaptureExecution | None = None,
    desc: str = "capture",
) -> list[Accumulator]:
    """``accumulators`` filled over ``batches``: from ``cache`` (the model's and the batches'; None: no
    cache) where it holds them, the rest in one capture pass run as the capture plan ``execution``
    says (None: whole-model), then stored in ``cache``. Returns ``accumulators``."""
    missing = [a for a in accumulators if cache is None or not cache.restore(a)]
    if missing:
        with stage("capture", desc):
            run_capture(adapter, batches, missing, desc=desc, execution=execution)
        if cache is not None:
            for accumulator in missing:
                cache.store(accumulator)
    return accumulators
