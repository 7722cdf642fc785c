"""How a capture runs, planned from measured free memory: whole-model or layer-wise, where the
layer-wise block inputs wait, how much memory the statistics may take, and in which precision
their products are taken.

Every budget is a ``capture`` key; ``null`` means "measured": free GPU memory
(``torch.cuda.mem_get_info``) or available host memory (``/proc/meminfo``). Each decision comes
with a one-line reason that the job logs.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, replace

import torch

from replaceme_exp.capture.token_store import available_cpu_bytes
from replaceme_exp.config.protocol import left_to_protocol, protocol_rule
from replaceme_exp.config.schema import CaptureConfig, JobConfig, ModelConfig
from replaceme_exp.models.adapters import adapter_class, adapter_for
from replaceme_exp.models.loading import checkpoint_folder, resolve_dtype, tensor_shapes
from replaceme_exp.models.shape import meta_model, model_config, preload_config

log = logging.getLogger(__name__)

GIB = 2**30
# Compute capabilities whose FP64 rate is half the FP32 rate (P100, V100, A100, H100, B100/B200);
# other GPUs run FP64 at 1/32 to 1/64 of FP32.
FULL_RATE_FP64 = ((6, 0), (7, 0), (8, 0), (9, 0), (10, 0))
DEFAULT_STATS_GB = 8.0  # the statistics budget when free memory cannot be measured


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f} GiB"


@dataclass(frozen=True)
class CaptureExecution:
    """The plan of the captures of one job.

    ``mode``: ``whole`` (each batch through the model as loaded) or ``layerwise`` (one block at a
    time on ``device``, the model in host memory). ``store``, ``max_gpu_gb``, ``max_cpu_gb``,
    ``chunk_batches``, ``directory``: where layer-wise block inputs and kept activations wait
    (:func:`choose_store_layout`). ``stats_bytes``: what the statistics may take on ``device``.
    ``reason``: why, in one line. ``last_state``: the last block's state the hooks hand on
    (``block_output`` or ``final_norm``, ``capture.last_state``: :func:`last_state_of_the_protocol`).
    """

    mode: str = "whole"
    device: torch.device = torch.device("cpu")
    store: str = "auto"
    max_gpu_gb: float | None = None
    max_cpu_gb: float | None = None
    chunk_batches: int | None = None
    directory: str | None = None
    stats_bytes: float = DEFAULT_STATS_GB * GIB
    reason: str = ""
    last_state: str = "block_output"


@protocol_rule("capture.last_state")
def last_state_of_the_protocol(config: JobConfig) -> dict:
    """``capture.last_state=null``: ``block_output`` under ``protocol=paper`` (the paper's
    ``L_{N-1}``), ``final_norm`` under ``protocol=official`` (distance.py, lstsq.py and
    cosine_dist.py read ``outputs.hidden_states``, whose last entry is after the model's final norm)."""
    if not left_to_protocol(config, "capture.last_state"):
        return {}
    return {"capture.last_state": "final_norm" if config.protocol == "official" else "block_output"}


@dataclass(frozen=True)
class StoreLayout:
    """Where layer-wise block inputs wait (``gpu`` = on the compute device, ``cpu`` = pinned host
    memory, ``disk``), how many batches run through the blocks together, and why."""

    location: str
    chunk_batches: int
    reason: str


@dataclass(frozen=True)
class ModelMemory:
    """Bytes of the model's parameters (all, and its largest block) in the load dtype, and the
    shapes that size a forward pass."""

    weights: int
    largest_block: int
    hidden: int
    intermediate: int
    heads: int
    itemsize: int
    positions: int | None = None  # tokens per input of a vision encoder (patches and the class token)

    def forward_activations(self, batch_size: int, seq_len: int) -> int:
        """Peak bytes of one block's inference activations on a (batch, seq) batch: hidden-size
        tensors (residual, norm, attention output, MLP output), the MLP's intermediate tensors,
        and attention scores as if materialised (an upper bound; fused attention needs less)."""
        tokens = batch_size * seq_len
        dense = tokens * (6 * self.hidden + 3 * self.intermediate)
        scores = batch_size * self.heads * seq_len * seq_len
        return (dense + scores) * self.itemsize


BLOCK_TENSOR = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a decoder block's tensor: model.layers.<i>.…


def parameter_counts(model_cfg: ModelConfig, cache_dir: str) -> tuple[int, int] | None:
    """(parameters, the largest block's parameters) of ``model_cfg``'s checkpoint from its
    safetensors headers (no weight read, no modeling code imported); None where there is no such
    checkpoint on this machine."""
    folder = checkpoint_folder(model_cfg, cache_dir)
    shapes = tensor_shapes(folder) if folder is not None else None
    if not shapes:
        return None
    blocks: dict[int, int] = {}
    for name, shape in shapes.items():
        if found := BLOCK_TENSOR.search(name):
            blocks[int(found.group(1))] = blocks.get(int(found.group(1)), 0) + math.prod(shape)
    if not blocks:
        return None
    return sum(math.prod(shape) for shape in shapes.values()), max(blocks.values())


def model_memory(model_cfg: ModelConfig, cache_dir: str = ".cache") -> ModelMemory | None:
    """The parameter bytes of ``model_cfg``'s model from its config alone: an embedded or local
    checkpoint's counted from its safetensors headers, another's instantiated on the meta device
    (nothing is allocated or downloaded beyond the config). None when the config cannot be read
    (the load that follows reports why)."""
    try:
        counts = parameter_counts(model_cfg, cache_dir)
        # counted from the headers, the sizes need only the saved config; else the meta model is counted
        config = preload_config(model_cfg, cache_dir) if counts is not None else model_config(model_cfg, cache_dir)
        model = meta_model(model_cfg, config) if config is not None and counts is None else None
    except Exception as err:  # noqa: BLE001 - planning falls back to the whole-model capture
        log.info("capture plan: the model's size is unknown (%s)", err)
        return None
    if config is None:
        log.info("capture plan: the model's size is unknown (its config cannot be read before the load)")
        return None
    if counts is None:
        adapter = adapter_for(model)
        counts = (
            sum(p.numel() for p in model.parameters()),
            max(sum(p.numel() for p in layer.parameters()) for layer in adapter.layers),
        )
    itemsize = torch.tensor([], dtype=resolve_dtype(model_cfg.dtype)).element_size()
    text = adapter_class(config).block_config(config)  # the blocks' own config (a CLIP's vision config)
    return ModelMemory(
        weights=counts[0] * itemsize,
        largest_block=counts[1] * itemsize,
        hidden=int(text.hidden_size),
        intermediate=int(
            getattr(text, "intermediate_size", None) or getattr(text, "ffn_hidden_size", None) or 4 * text.hidden_size
        ),
        heads=int(text.num_attention_heads),
        itemsize=itemsize,
        positions=(text.image_size // text.patch_size) ** 2 + 1 if hasattr(text, "patch_size") else None,
    )


def compute_device(capture_cfg) -> torch.device:
    """The compute device of ``capture.device`` (``auto``: cuda if present)."""
    name = capture_cfg.device
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def free_gpu_bytes(device: torch.device, all_devices: bool = False) -> int:
    """Free memory of ``device`` (or of every visible GPU) as the driver reports it."""
    if device.type != "cuda":
        return 0
    if all_devices:
        return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
    return torch.cuda.mem_get_info(device)[0]


def plan_execution(
    capture: CaptureConfig,
    model: ModelConfig,
    batch_size: int,
    seq_len: int | None,
    memory: ModelMemory | None = None,
    free_bytes: int | None = None,
    cache_dir: str = ".cache",
) -> CaptureExecution:
    """Whole-model or layer-wise capture (``capture.mode``) of ``model`` on batches of
    ``batch_size`` sequences of ``seq_len`` tokens (None: an image's positions), and the statistics
    budget, from the model's size (``memory``, computed from its config when None) and the
    measured free memory of the compute device (``free_bytes`` overrides the measurement).

    ``auto`` takes the whole-model capture when the weights, one batch's activations and the
    statistics budget fit in ``capture.max_gpu_gb`` (null: 90% of the free GPU memory, all GPUs
    with ``model.device_map``), else layer-wise; on a machine without GPU always whole-model
    (the model is in host memory either way)."""
    mode = capture.mode
    device = compute_device(capture)
    store = capture.layerwise
    base = CaptureExecution(
        device=device,
        store=store.location,
        max_gpu_gb=store.max_gpu_gb,
        max_cpu_gb=store.max_cpu_gb,
        chunk_batches=store.chunk_batches,
        directory=store.directory,
        last_state=capture.last_state or "block_output",
    )
    budget = _memory_budget(capture, model, device, free_bytes)
    if memory is None and mode != "whole":
        memory = model_memory(model, cache_dir)
    seq_len = seq_len or (memory.positions if memory else None) or 1
    activations = memory.forward_activations(int(batch_size), int(seq_len)) if memory else 0
    where = "GPU memory" if device.type == "cuda" else "host memory"
    if mode == "layerwise" or (mode == "auto" and device.type == "cuda" and memory is not None):
        return _whole_if_it_fits(capture, base, memory, activations, budget, where)
    if mode == "auto" and device.type == "cuda":
        reason = "whole-model capture: the model's size is unknown"
        return replace(base, mode="whole", stats_bytes=_stats_budget(capture, None), reason=reason)
    weights = memory.weights if memory else 0
    stats = _stats_budget(capture, budget - weights - activations if memory else None)
    why = "capture.mode=whole" if mode == "whole" else f"no GPU: the model runs in {where}"
    reason = f"whole-model capture: {why}; statistics may take {gib(stats)}"
    return replace(base, mode="whole", stats_bytes=stats, reason=reason)


def _memory_budget(capture: CaptureConfig, model: ModelConfig, device, free_bytes: int | None) -> float:
    """The bytes the capture may use: ``capture.max_gpu_gb`` when set, else 90% of the free GPU memory
    (every GPU with ``model.device_map``) or, without a GPU, half the available host memory;
    ``free_bytes`` overrides the measurement."""
    if free_bytes is None:
        spread = model.device_map is not None
        free_bytes = free_gpu_bytes(device, all_devices=spread) if device.type == "cuda" else available_cpu_bytes()
    budget = float(capture.max_gpu_gb) * GIB if capture.max_gpu_gb is not None else 0.9 * free_bytes
    if device.type != "cuda" and capture.max_gpu_gb is None:
        budget = 0.5 * free_bytes
    return budget


def _whole_if_it_fits(
    capture: CaptureConfig,
    base: CaptureExecution,
    memory: ModelMemory | None,
    activations: float,
    budget: float,
    where: str,
) -> CaptureExecution:
    """Under ``capture.mode=auto`` on a GPU: whole-model when the weights and one batch's activations fit
    in ``budget``, else layer-wise; under ``capture.mode=layerwise``: layer-wise. The statistics get
    what the resident part leaves."""
    device = base.device
    whole_need = memory.weights + activations if memory else None
    if capture.mode == "auto" and whole_need <= budget:
        stats = _stats_budget(capture, budget - whole_need)
        reason = (
            f"whole-model capture: weights {gib(memory.weights)} + activations {gib(activations)} fit in "
            f"{gib(budget)} of {where}; statistics may take {gib(stats)}"
        )
        return replace(base, mode="whole", stats_bytes=stats, reason=reason)
    resident = (memory.largest_block + activations) if memory else 0
    stats = _stats_budget(capture, budget - resident)
    why = (
        "capture.mode=layerwise"
        if capture.mode == "layerwise"
        else f"weights {gib(memory.weights)} + activations {gib(activations)} exceed {gib(budget)} of {where}"
    )
    size = f"; one block at a time on {device} ({gib(memory.largest_block)})" if memory else f" on {device}"
    reason = f"layer-wise capture: {why}{size}; statistics may take {gib(stats)}"
    return replace(base, mode="layerwise", stats_bytes=stats, reason=reason)


def _stats_budget(capture: CaptureConfig, left: float | None) -> float:
    """``capture.max_stats_gb`` when set, else what is left of the memory budget (at least one
    cut's statistics must fit, so never below 0), else the default."""
    if capture.max_stats_gb is not None:
        return float(capture.max_stats_gb) * GIB
    if left is None:
        return DEFAULT_STATS_GB * GIB
    return max(float(left), 0.0)


def choose_store_layout(execution: CaptureExecution, hidden_bytes: list[int], kept_bytes: list[int]) -> StoreLayout:
    """Where a layer-wise capture keeps each batch's block input (``hidden_bytes``) and the
    activations it keeps for pending statistics (``kept_bytes``, at their peak), per batch.

    ``auto``: on the compute device when everything fits in ``capture.layerwise.max_gpu_gb`` (null: half of
    its free memory), else pinned host memory within ``capture.layerwise.max_cpu_gb`` (null: half of the
    available memory), else the block inputs on disk; batches then run in chunks whose kept
    activations fit in host memory. ``capture.layerwise.chunk_batches`` fixes the chunk."""
    n = len(hidden_bytes)
    total = sum(hidden_bytes) + sum(kept_bytes)
    device = execution.device
    if execution.max_gpu_gb is not None:
        device_budget = execution.max_gpu_gb * GIB
    elif device.type == "cuda":
        device_budget = free_gpu_bytes(device) / 2
    else:
        device_budget = available_cpu_bytes() / 2
    host_budget = execution.max_cpu_gb * GIB if execution.max_cpu_gb is not None else available_cpu_bytes() / 2
    location = execution.store
    if location == "auto":
        location = "gpu" if total <= device_budget else "cpu" if total <= host_budget else "disk"
    chunk = execution.chunk_batches or n
    if execution.chunk_batches is None and location == "disk" and kept_bytes and max(kept_bytes) > 0:
        chunk = max(1, min(n, int(host_budget // max(kept_bytes))))
    what = f"block inputs {gib(sum(hidden_bytes))} + kept activations {gib(sum(kept_bytes))}"
    place = {"gpu": f"on {device}", "cpu": "in pinned host memory", "disk": "block inputs on disk"}[location]
    budgets = f"budgets: {device} {gib(device_budget)}, host {gib(host_budget)}"
    chunks = f", {-(-n // chunk)} chunks of {chunk} batches" if chunk < n else ""
    return StoreLayout(location, max(1, chunk), f"{what} {place}{chunks} ({budgets})")


def resolve_precision(name: str, device: torch.device) -> str:
    """``float64`` or ``float32`` for the statistics' products. ``auto``: float64 on CPUs and on
    GPUs with full-rate FP64 (compute capability in :data:`FULL_RATE_FP64`), float32 products
    summed in float64 elsewhere."""
    if name != "auto":
        return name
    if device.type != "cuda":
        return "float64"
    return "float64" if torch.cuda.get_device_capability(device) in FULL_RATE_FP64 else "float32"


def capture_precision(capture: CaptureConfig) -> str:
    """The precision the statistics are taken in on this machine."""
    return resolve_precision(capture.precision, compute_device(capture))
