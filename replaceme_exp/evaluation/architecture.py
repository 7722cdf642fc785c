"""What a pruned model's speed depends on: its architecture, and the analytic cost of a token through it.

Two pruned models with the same architecture run at the same speed whatever numbers their weights hold:
ReplaceMe's LS and its sink-aware variant, UIDL and ShortGPT removing the same number of blocks, a fused
T and plain removal. A speed measured for one of them is the speed of all of them; what differs between
two such rows is the machine's drift between jobs, not the method. So the speed stage measures an
architecture a few times (``eval.speed.jobs_per_architecture``, in different jobs) and then reuses what
was measured (:class:`SpeedStore`), and tables show speed per architecture, with the spread between the
jobs that measured it, beside two analytic ratios that no machine moves: forward FLOPs per token and
weight bytes.

- :func:`architecture_signature`: the module tree (each module's path, class and parameter shapes) and
  the config keys that change the computation (attention pattern, heads, window), by SHA-256.
- :func:`forward_flops_per_token`: ``2 x`` the multiply-accumulates of every linear layer a token
  passes (the LM head included, embeddings looked up, not multiplied), plus attention's scores and
  weighted sum, ``4 x context x (heads x head_dim)`` per attention layer, at the mean context of a
  ``prompt_len`` prefill (``(prompt_len + 1) / 2``) or the window where the layer slides.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from replaceme_exp.storage import read_keyed_json, write_keyed_json, write_optional
from replaceme_exp.surgery import beside_weights

# What each column the speed stage adds per architecture means (for replaceme_exp/results/columns.py).
ARCHITECTURE_COLUMNS: dict[str, str] = {
    "speed_architecture": "The pruned model's architecture by content (module tree, parameter shapes, the config "
    "keys that change the computation): rows with the same one run at the same speed.",
    "speed_architecture_baseline": "The same of the unpruned model.",
    "speed_reused": "True when the job measured nothing and its speed columns are the figures of the jobs that "
    "measured its architecture on this machine (`speed_jobs` of them): the median over those jobs, and "
    "`_min` / `_max` the range between them.",
    "speed_jobs": "Jobs whose measurements of this architecture (on this machine, with these settings) the row's "
    "speed columns rest on, this job's included when it measured.",
    "speed_processor": "The processor the speed was measured on (the CPU's model name, or the GPU's).",
    "flops_per_token": "Analytic forward FLOPs per token of the pruned model at the mean context of a "
    "`speed_prompt_len` prefill (linear layers, the LM head, attention's scores and weighted sum).",
    "flops_per_token_baseline": "The same of the unpruned model.",
    "flops_ratio": "`flops_per_token / flops_per_token_baseline`: what the architecture saves, on any machine.",
}

# Config keys that change what a forward computes without changing any parameter's shape.
COMPUTE_KEYS = (
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "layer_types",
    "sliding_window",
    "sliding_window_pattern",
    "attention_chunk_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "hidden_act",
    "hidden_activation",
)


def architecture_signature(model: nn.Module) -> str:
    """The pruned model's architecture by content (16 hex digits): every module's path, class and the
    shapes and dtypes of its own parameters, what it carries beside them (a separate T, an FFN
    replacement), and the config's :data:`COMPUTE_KEYS`. Equal signatures: the same computation on
    tensors of the same shapes."""
    h = hashlib.sha256()
    for name, module in model.named_modules():
        shapes = [(p, tuple(t.shape), str(t.dtype)) for p, t in module.named_parameters(recurse=False)]
        h.update(json.dumps([name, type(module).__name__, shapes]).encode())
    extra = {key: {n: tuple(t.shape) for n, t in tensors.items()} for key, tensors in beside_weights(model).items()}
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    config = getattr(model, "config", None)
    if config is not None:
        text = getattr(config, "get_text_config", lambda: config)()
        found = {key: getattr(text, key, None) for key in COMPUTE_KEYS}
        h.update(json.dumps(found, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _attention_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("Attention") and any(True for _ in m.children())]


def forward_flops_per_token(model: nn.Module, prompt_len: int) -> float:
    """Analytic forward FLOPs of one token of a ``prompt_len`` prefill (module docstring)."""
    linear = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    extra = sum(
        t.shape[0] * t.shape[1] for tensors in beside_weights(model).values() for t in tensors.values() if t.dim() == 2
    )
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    heads = getattr(text, "num_attention_heads", 0) or 0
    head_dim = getattr(text, "head_dim", None) or (getattr(text, "hidden_size", 0) // heads if heads else 0)
    window = getattr(text, "sliding_window", None)
    layer_types = list(getattr(text, "layer_types", None) or [])
    context = (prompt_len + 1) / 2
    attention = 0.0
    for i, _ in enumerate(_attention_layers(model)):
        sliding = i < len(layer_types) and "sliding" in str(layer_types[i]) and window
        attention += 4 * min(context, window) * heads * head_dim if sliding else 4 * context * heads * head_dim
    return 2.0 * (linear + extra) + attention


@dataclass(frozen=True)
class Machine:
    """Where a speed was measured: device, dtype, CPU threads, torch, and the processor's name."""

    device: str
    dtype: str
    threads: int
    torch: str
    processor: str

    @classmethod
    def here(cls, device: torch.device, dtype: torch.dtype) -> "Machine":
        if device.type == "cuda":
            processor = torch.cuda.get_device_name(device)
        else:
            processor = _cpu_name()
        return cls(
            str(device.type), str(dtype).removeprefix("torch."), torch.get_num_threads(), torch.__version__, processor
        )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class SpeedStore:
    """The speed rows measured per (architecture of the pruned model, architecture of the unpruned one,
    speed settings, :class:`Machine`), under ``root`` (``capture.cache_dir/speed``): each entry the
    list of measurements of that key, one per job, written atomically with its key and a checksum."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _path(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
        return self.root / f"speed-{digest}.json"

    def measured(self, key: dict[str, Any]) -> list[dict]:
        """The measurements of ``key`` so far (none: an empty list; a damaged entry counts as none)."""
        found = read_keyed_json(self._path(key), key, "speed measurements")
        return list(found) if isinstance(found, list) else []

    def add(self, key: dict[str, Any], row: dict) -> list[dict]:
        """Append one job's measurement (its speed row) and return every measurement of ``key``."""
        rows = [*self.measured(key), row]
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_optional("speed measurements", path, lambda: write_keyed_json(path, key, rows))
        return rows
