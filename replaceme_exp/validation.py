"""The whole configuration checked before anything expensive runs: every key's type, range and
allowed values, so a typo costs a second, not a 70B model load.

``SCHEMA`` is the typed schema of the keys users type: one :class:`Key` per dotted key, with its
type and its constraint. ``validate_config`` checks a composed config against it (and the few
rules that involve several keys) and raises one :class:`ConfigError` naming the key, the value and
the reason. Keys a group does not have are skipped (``objective.lr`` exists only for the numerical
objectives); unknown keys are Hydra's to refuse.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.errors import ConfigError

_MISSING = object()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_int(v) -> str | None:
    return None if _is_int(v) and v > 0 else "must be a positive integer"


def non_negative_int(v) -> str | None:
    return None if _is_int(v) and v >= 0 else "must be an integer >= 0"


def any_int(v) -> str | None:
    return None if _is_int(v) else "must be an integer"


def boolean(v) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def finite_non_negative(v) -> str | None:
    if not _is_number(v) or not math.isfinite(v):
        return "must be a finite number >= 0"
    return None if v >= 0 else "must be a finite number >= 0"


def finite_positive(v) -> str | None:
    return None if _is_number(v) and math.isfinite(v) and v > 0 else "must be a finite number > 0"


def unit_interval_open_right(v) -> str | None:
    return None if _is_number(v) and 0 <= v < 1 else "must be a number in [0, 1)"


def above_one(v) -> str | None:
    if not _is_number(v) or not math.isfinite(v) or v <= 1:
        return "must be a finite number > 1"
    return None


def optional(check: Callable) -> Callable:
    return lambda v: None if v is None else check(v)


def choice(*options) -> Callable:
    return lambda v: None if v in options else f"choose one of {', '.join(map(str, options))}"


def n_prune_value(v) -> str | None:
    if _is_int(v) and v >= 1:
        return None
    if isinstance(v, float) and 0 < v < 1:
        return None
    return "must be a positive integer (blocks) or a fraction in (0, 1) of them"


def cuts_value(v) -> str | None:
    if v is None:
        return None
    if not isinstance(v, list) or not v:
        return "give a non-empty list of [start, end) pairs, e.g. cuts='[[20,28]]'"
    for cut in v:
        if not isinstance(cut, list) or len(cut) != 2 or not all(_is_int(x) for x in cut):
            return f"{cut!r} is not a [start, end) pair of integers"
        if not 1 <= cut[0] < cut[1]:
            return f"[{cut[0]}, {cut[1]}) needs 1 <= start < end"
    return None


def device_value(v) -> str | None:
    if v is None or v in ("auto", "cpu", "cuda", "mps") or (isinstance(v, str) and re.fullmatch(r"cuda:\d+", v)):
        return None
    return "choose auto, cpu, cuda, cuda:<index> or mps"


def harness_limit(v) -> str | None:
    if v is None or (_is_int(v) and v > 0) or (isinstance(v, float) and 0 < v <= 1):
        return None
    return "must be null, a positive number of documents or a fraction in (0, 1]"


def non_empty_text(v) -> str | None:
    return None if isinstance(v, str) and v.strip() else "must be a non-empty string"


def sample_prompts(v) -> str | None:
    if isinstance(v, list) and v and all(isinstance(p, str) and p.strip() for p in v):
        return None
    return "must be a non-empty list of non-empty strings"


def lora_targets(v) -> str | None:
    if v == "mlp" or (isinstance(v, list) and v and all(isinstance(p, str) and p.strip() for p in v)):
        return None
    return "must be mlp (the family's MLP projections) or a non-empty list of linear layer names"


def percent_step(v) -> str | None:
    return None if _is_number(v) and 0 < v <= 100 else "must be a number in (0, 100]"


def mapping(v) -> str | None:
    return None if isinstance(v, dict) else "must be a mapping (or null)"


@dataclass(frozen=True)
class Key:
    """One typed key of the schema: ``check(value)`` returns None or the reason it is refused."""

    path: str
    check: Callable[[Any], str | None]
    required: bool = False


TEXT_SOURCES = ("pydoc", "pydoc_chat", "text_file", "hf_dataset", "generated", "mix")
IMAGE_SOURCES = ("bundled_images", "image_folder", "hub_images")  # replaceme_exp.data.images


def is_vision_model(data: dict) -> bool:
    model = data.get("model") or {}
    config = model.get("config") or {}
    return model.get("source") == "hub_clip_vision" or config.get("model_type") in ("clip", "clip_vision_model")


SCHEMA: tuple[Key, ...] = (
    # top level
    Key("n_prune", n_prune_value, True),
    Key("num_lts", positive_int, True),
    Key("alpha", finite_non_negative, True),
    Key("merge_consecutive", boolean, True),
    Key("multi_lt", choice("independent", "sequential"), True),
    Key("cuts", cuts_value),
    Key("lt_placement", choice("fused", "separate"), True),
    Key("mask_ratio", unit_interval_open_right, True),
    Key("mask_passes", positive_int),
    Key("solver_schedule", choice("full_batch", "minibatch")),
    Key("seed", any_int, True),
    Key("record_layer_distances", boolean),
    Key("save_model", boolean),
    Key("force", boolean),
    # model
    Key("model.source", choice("embedded", "hub", "local", "random", "hub_clip_vision"), True),
    Key("model.dtype", choice("float32", "float16", "bfloat16"), True),
    Key("model.device", device_value),
    Key("model.capture_4bit", boolean),
    # calibration
    Key("calibration.source", choice(*TEXT_SOURCES, *IMAGE_SOURCES), True),
    Key("calibration.max_new_tokens", positive_int),
    Key("calibration.generation_batch_size", positive_int),
    Key("calibration.temperature", finite_non_negative),
    Key("calibration.n_samples", positive_int, True),
    Key("calibration.seq_len", positive_int),  # required for text sources (validate_config)
    Key("calibration.batch_size", positive_int, True),
    Key("calibration.seed", any_int),
    Key("calibration.padding_side", choice("left", "right")),
    Key("calibration.order", choice("shuffled", "first")),
    Key("calibration.chat_turns", choice("all", "first_pair")),
    Key("calibration.streaming", boolean),
    # selection, objective, regulariser, structure, healing
    Key("selection.metric", choice("cosine", "angular", "l2", "ls_residual", "cka", "cca"), True),
    Key("selection.tokens", choice("all", "last"), True),
    Key("objective.solver", choice("adam", "lbfgs", "nlcg", "trust_ncg")),
    Key("objective.loss", choice("cosine", "cosine_exact", "mse")),
    Key("objective.schedule", choice("full_batch", "minibatch")),
    Key("objective.init", choice("identity", "ls")),
    Key("objective.lr", finite_positive),
    Key("objective.batch_tokens", positive_int),
    Key("objective.epochs", positive_int),
    Key("objective.max_iter", positive_int),
    Key("objective.chunk_tokens", positive_int),
    Key("objective.max_condition", finite_positive),
    Key("estimation.tokens", choice("all", "skip_first", "skip_massive", "rescale_massive")),
    Key("estimation.first", positive_int),
    Key("estimation.massive_threshold", above_one),
    Key("regularizer.name", choice("none", "l1", "l2"), True),
    Key("structure.name", choice("generic", "diagonal", "orthonormal"), True),
    Key("healing.name", choice("none", "lt_only", "full_model", "lora"), True),
    Key("healing.optimizer", choice("adam")),
    Key("healing.lr", finite_positive),
    Key("healing.weight_decay", finite_non_negative),
    Key("healing.max_grad_norm", optional(finite_positive)),
    Key("healing.context_length", positive_int),
    Key("healing.batch_size", positive_int),
    Key("healing.gradient_accumulation_steps", positive_int),
    Key("healing.max_steps", positive_int),
    Key("healing.gradient_checkpointing", boolean),
    Key("healing.seed", any_int),
    Key("healing.log_every", positive_int),
    Key("healing.data.source", choice("pydoc", "text_file", "hf_dataset")),
    Key("healing.data.n_documents", positive_int),
    Key("healing.data.streaming", boolean),
    Key("healing.lora.r", positive_int),
    Key("healing.lora.alpha", finite_positive),
    Key("healing.lora.dropout", unit_interval_open_right),
    Key("healing.lora.target_modules", lora_targets),
    # evaluation
    Key("eval.text", choice("pydoc_heldout", "text_file"), True),
    Key("eval.seq_len", positive_int, True),
    Key("eval.max_windows", positive_int, True),
    Key("eval.batch_size", positive_int, True),
    Key("eval.limit", optional(positive_int)),
    Key("eval.amp", boolean),
    Key("eval.harness.batch_size", positive_int),
    Key("eval.harness.add_bos_token", boolean),
    Key("eval.harness.max_length", optional(positive_int)),
    Key("eval.harness.limit", harness_limit),
    Key("eval.harness.bootstrap_iters", non_negative_int),
    Key("eval.harness.local_tasks", boolean),
    Key("eval.samples", optional(mapping)),
    Key("eval.samples.prompts", sample_prompts),
    Key("eval.samples.max_new_tokens", positive_int),
    # how a job runs
    Key("capture.mode", choice("auto", "whole", "layerwise")),
    Key("capture.device", device_value),
    Key("capture.max_gpu_gb", optional(finite_positive)),
    Key("capture.passes", choice("auto", "one", "two"), True),
    Key("capture.max_stats_gb", optional(finite_positive)),
    Key("capture.precision", choice("auto", "float64", "float32")),
    Key("capture.layerwise.location", choice("auto", "gpu", "cpu", "disk")),
    Key("capture.layerwise.max_gpu_gb", optional(finite_positive)),
    Key("capture.layerwise.max_cpu_gb", optional(finite_positive)),
    Key("capture.layerwise.chunk_batches", optional(positive_int)),
    Key("capture.cache", boolean),
    Key("store.location", choice("auto", "gpu", "cpu", "disk")),
    Key("store.max_gpu_gb", optional(finite_positive)),
    Key("store.max_cpu_gb", optional(finite_positive)),
    Key("tracking.wandb.mode", choice("online", "offline", "disabled")),
    Key("tracking.wandb.group", optional(non_empty_text)),
    Key("tracking.codecarbon.enabled", boolean),
    Key("progress.mode", choice("auto", "bar", "log", "off")),
    Key("progress.every_percent", percent_step),
    Key("progress.every_seconds", finite_positive),
)


def _value(container: dict, path: str):
    node: Any = container
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def writable_directory(key: str, value) -> None:
    """``value`` names a directory this process can create and write (checked before any model
    load or conversion)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "must be a directory path")
    path = Path(value).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(key, value, f"{existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(key, value, f"{existing} is not writable")


def validate_config(cfg: DictConfig) -> None:
    """Check ``cfg`` against :data:`SCHEMA` and the rules that join keys; raises the first
    :class:`ConfigError` (key, value, reason). Cheap: no model, no data."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # noqa: BLE001 - an interpolation that cannot resolve
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError("config", "<interpolation>", f"cannot be resolved: {first_line}") from err
    for key in SCHEMA:
        value = _value(data, key.path)
        if value is _MISSING:
            if key.required:
                raise ConfigError(key.path, None, "is missing")
            continue
        reason = key.check(value)
        if reason:
            raise ConfigError(key.path, value, reason)
    if (harness := OmegaConf.select(cfg, "eval.harness")) is not None:
        from replaceme_exp.evaluation.harness import declared_metrics

        declared_metrics(harness)  # one metric per task, before any model loads
    for key in ("results_dir", "cache_dir"):
        writable_directory(key, data.get(key))
    first, seq_len = _value(data, "estimation.first"), _value(data, "calibration.seq_len")
    if _value(data, "estimation.tokens") == "skip_first" and _is_int(first) and _is_int(seq_len) and first >= seq_len:
        raise ConfigError("estimation.first", first, f"leaves no token of sequences of calibration.seq_len={seq_len}")
    metric = _value(data, "selection.metric")
    if metric in ("ls_residual", "cka", "cca") and _value(data, "selection.tokens") == "last":
        raise ConfigError("selection.tokens", "last", f"selection.metric={metric} is computed over all tokens")
    source = _value(data, "calibration.source")
    benchmarks = _value(data, "eval.benchmarks")
    if is_vision_model(data):
        name = _value(data, "model.name")
        if source not in IMAGE_SOURCES:
            reason = f"model={name} is a vision encoder: calibrate it on images ({', '.join(IMAGE_SOURCES)})"
            raise ConfigError("calibration.source", source, reason)
        if benchmarks in (_MISSING, None):
            raise ConfigError(
                "eval", _value(data, "eval.name"), f"has no image benchmarks for model={name} (eval=clip)"
            )
    elif benchmarks not in (_MISSING, None):
        raise ConfigError(
            "eval.benchmarks", benchmarks, "are image benchmarks, for vision encoders (model=clip_vit_l14)"
        )
    if benchmarks not in (_MISSING, None):
        from replaceme_exp.evaluation.clip_benchmarks import benchmark_task

        for name in benchmarks if isinstance(benchmarks, list) else [benchmarks]:
            benchmark_task(name)
    if source in IMAGE_SOURCES:
        if not is_vision_model(data):
            name = _value(data, "model.name")
            raise ConfigError("calibration.source", source, f"is image data for vision encoders, not model={name}")
        if source == "image_folder" and not Path(str(_value(data, "calibration.path"))).expanduser().is_dir():
            raise ConfigError("calibration.path", _value(data, "calibration.path"), "no such image folder")
        dataset = _value(data, "calibration.dataset")
        if source == "hub_images" and (not isinstance(dataset, str) or dataset in ("", "???")):
            raise ConfigError("calibration.dataset", dataset, "name the hub image dataset (owner/name)")
    elif _value(data, "calibration.seq_len") is _MISSING:
        raise ConfigError("calibration.seq_len", None, "is missing")
    if source == "text_file" or (source == "hf_dataset" and _value(data, "calibration.dataset") == "json"):
        path = _value(data, "calibration.path")
        paths = path if isinstance(path, list) and path else [path]
        for one in paths:
            if not isinstance(one, str) or not Path(one).expanduser().is_file():
                raise ConfigError("calibration.path", path, "no such file")
    if source == "generated" and (prompts := _value(data, "calibration.prompts_path")) not in (None, _MISSING):
        if not isinstance(prompts, str) or not Path(prompts).expanduser().is_file():
            raise ConfigError("calibration.prompts_path", prompts, "no such file")
    if source == "generated" and _value(data, "calibration.prompts_dataset") == "json":
        files = _value(data, "calibration.prompts_data_files")
        listed = files if isinstance(files, list) and files else [files]
        if not all(isinstance(f, str) and Path(f).expanduser().is_file() for f in listed):
            raise ConfigError("calibration.prompts_data_files", files, "no such file (prompts_dataset=json reads it)")
    if _value(data, "capture.mode") == "layerwise" and _value(data, "model.capture_4bit") is True:
        reason = "not with model.capture_4bit (a 4-bit copy is placed on the GPU)"
        raise ConfigError("capture.mode", "layerwise", reason)
    if source == "generated" and _value(data, "model.capture_4bit") is True:
        reason = "not with model.capture_4bit (the answers would come from the 4-bit copy)"
        raise ConfigError("calibration.source", source, reason)
    if _value(data, "healing.name") not in ("none", _MISSING):
        for key in ("lr", "context_length", "batch_size", "gradient_accumulation_steps", "max_steps", "data"):
            if _value(data, f"healing.{key}") is _MISSING:
                raise ConfigError(f"healing.{key}", None, f"is missing (healing={_value(data, 'healing.name')})")
        if _value(data, "healing.data.source") == "text_file":
            path = _value(data, "healing.data.path")
            if not isinstance(path, str) or not Path(path).expanduser().is_file():
                raise ConfigError("healing.data.path", path, "no such file")
    if _value(data, "eval.text") == "text_file":
        path = _value(data, "eval.path")
        if not isinstance(path, str) or not Path(path).expanduser().is_file():
            raise ConfigError("eval.path", path, "no such file")


class DirectoryCheck(Callback):
    """Hydra callback (``hydra.callbacks.directory_check``): ``results_dir`` and ``cache_dir`` are
    checked before Hydra creates its run directory under ``results_dir`` (which would otherwise
    fail first, with a traceback): one line and exit code 2."""

    def _check(self, config: DictConfig) -> None:
        try:
            for key in ("results_dir", "cache_dir"):
                writable_directory(key, OmegaConf.select(config, key))
        except Exception as err:  # noqa: BLE001 - ConfigError, or an interpolation that cannot resolve
            logging.getLogger("replaceme_exp").error("invalid configuration: %s", str(err).splitlines()[0])
            sys.exit(2)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)
