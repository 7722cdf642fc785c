"""A model's shape from its config alone: depth, widths and positions, read before any weight loads.

The checks that need the depth (cuts, ``n_prune``, ``num_lts``) or the positions (sequence lengths)
run before the load. A checkpoint on this machine is read from its ``config.json`` as saved (no
transformers import: the load does that), another one through transformers' ``AutoConfig``; a
random config is instantiated on the meta device (nothing allocated), so that one transformers
cannot build is refused in one line instead of failing in the load.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from replaceme_exp.config.schema import ModelConfig
from replaceme_exp.errors import ConfigError, first_line
from replaceme_exp.models.adapters import adapter_class, adapter_for
from replaceme_exp.models.embedded import embedded_checkpoint, embedded_model
from replaceme_exp.models.loading import (
    check_safetensors_files,
    checkpoint_config,
    checkpoint_folder,
    is_vision_config,
    load_tokenizer,
    resolve_dtype,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShape:
    """``num_layers``: the blocks an adapter sees; ``max_positions``: the longest sequence a text
    model's position embeddings take (None: no limit known, or a vision encoder); ``hidden_size``:
    the width of the blocks' residual stream; ``unfusable_reason``: why T cannot be fused into its
    down-projections (its family's :attr:`~replaceme_exp.models.adapters.DecoderAdapter.unfusable_reason`;
    None: it can)."""

    num_layers: int
    max_positions: int | None
    model: nn.Module | None  # a random-weight config's model on the meta device (no storage); None for a checkpoint
    hidden_size: int | None = None
    unfusable_reason: str | None = None
    vocab_size: int | None = None


_IMPORTS = threading.Lock()


def _transformers(*names: str) -> list:
    """transformers' classes ``names``, imported under a lock: its lazy module is not safe to import
    from two threads at once (identical jobs started together). Reading a config imports no
    modeling code; a model class imports its family's (and transformers' shared modeling modules)."""
    with _IMPORTS:
        import transformers

        return [getattr(transformers, name) for name in names]


def _named(cfg: ModelConfig, field: str | None = None) -> tuple[str, object]:
    """The key and value an error about ``cfg``'s model config names: ``model.config`` (or one of
    its fields) for random weights, else the checkpoint."""
    if cfg.source != "random":
        return "model.pretrained", cfg.pretrained
    config = dict(cfg.config)
    return (f"model.config.{field}", config.get(field)) if field else ("model.config", config.get("model_type"))


# The sizes of a random-weight config that must be positive integers, and pairs (a, b) where a must be
# a multiple of b (without an explicit head_dim, heads split the hidden size).
SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings")  # fmt: skip
MULTIPLES = (("hidden_size", "num_attention_heads"), ("num_attention_heads", "num_key_value_heads"))


def check_random_config(cfg: ModelConfig) -> None:
    """A random-weight config's sizes, named key by key (``model.config.<key>``) before transformers
    is asked to build it."""
    config = dict(cfg.config)
    for name in SIZE_KEYS:
        value = config.get(name)
        if value is not None and not (type(value) is int and value > 0):
            raise ConfigError(f"model.config.{name}", value, "must be a positive integer")
    if (layers := config.get("num_hidden_layers")) is not None and layers < 2:
        raise ConfigError("model.config.num_hidden_layers", layers, "pruning needs at least 2 blocks")
    for whole, part in MULTIPLES:
        if whole == "hidden_size" and config.get("head_dim") is not None:
            continue
        a, b = config.get(whole), config.get(part)
        if a is not None and b is not None and a % b:
            raise ConfigError(f"model.config.{part}", b, f"must divide model.config.{whole}={a}")


def model_config(cfg: ModelConfig, cache_dir: str | os.PathLike = ".cache"):
    """The transformers config of ``cfg``'s model, without its weights. A random-weight config
    transformers refuses raises :class:`ConfigError` naming ``model.config``; a config that cannot
    be read (not cached offline, no network) gives None: the load says why."""
    (AutoConfig,) = _transformers("AutoConfig")
    if cfg.source == "random":
        check_random_config(cfg)
        try:
            return AutoConfig.for_model(**dict(cfg.config))
        except Exception as err:  # noqa: BLE001 - transformers validates configs with several error types
            key, value = _named(cfg)
            raise ConfigError(key, value, f"is not a config transformers can build: {first_line(err)}") from err
    try:
        if cfg.source == "embedded":
            return AutoConfig.from_pretrained(embedded_checkpoint(cache_dir, embedded_model(cfg.pretrained)))
        return AutoConfig.from_pretrained(cfg.pretrained, revision=cfg.revision)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - not cached offline, gated, unreadable: the load reports it
        if cfg.source == "local":  # a folder on this machine: its config is what it is
            raise ConfigError(*_named(cfg), f"has a config transformers cannot read: {first_line(err)}") from err
        log.debug("model config not readable before the load: %s", err)
        return None


# What the checks before the load read of a text model's block config (model_shape, and the capture
# plan's sizes: replaceme_exp/capture/execution.py). A saved config.json states the fields its model
# was built with, except those left at their class default or named the legacy way (``n_layer``):
# a config missing one of these is read through transformers, which fills them.
PRELOAD_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


def _attributes(value):
    """A JSON object as attributes (nested objects too, as a sub-config), like a transformers config."""
    if isinstance(value, dict):
        return SimpleNamespace(**{str(k): _attributes(v) for k, v in value.items()})
    return value


def saved_config(cfg: ModelConfig, cache_dir: str | os.PathLike = ".cache") -> SimpleNamespace | None:
    """An embedded or local text checkpoint's ``config.json`` as saved, as attributes, when it
    states its model type and every field of :data:`PRELOAD_FIELDS` in its family's block config
    (:meth:`DecoderAdapter.block_config`); None otherwise (another source, a vision model, a field
    transformers would fill)."""
    folder = checkpoint_folder(cfg, str(cache_dir))
    if folder is None or not (data := checkpoint_config(folder)).get("model_type"):
        return None
    config = _attributes(data)
    try:
        blocks = adapter_class(config).block_config(config)
    except ConfigError:
        return None  # an unsupported family: transformers' config says so in the usual words
    if any(type(getattr(blocks, name, None)) is not int for name in PRELOAD_FIELDS):
        return None
    return config


def preload_config(cfg: ModelConfig, cache_dir: str | os.PathLike = ".cache"):
    """The config the checks before the load read: :func:`saved_config` where it has what they
    read, else :func:`model_config` (None when that cannot be read either)."""
    if cfg.source != "random" and (saved := saved_config(cfg, cache_dir)) is not None:
        return saved
    return model_config(cfg, cache_dir)


def meta_model(cfg: ModelConfig, config) -> nn.Module:
    """``cfg``'s model built from ``config`` on the meta device; a shape transformers cannot
    build raises :class:`ConfigError` naming the model's config."""
    vision = is_vision_config(cfg)
    (model_class,) = _transformers("CLIPModel" if vision else "AutoModelForCausalLM")
    key, value = _named(cfg)
    try:
        with torch.device("meta"):
            if vision:
                return model_class(config)
            return model_class.from_config(config, dtype=resolve_dtype(cfg.dtype))
    except Exception as err:  # noqa: BLE001 - impossible shapes fail with several error types
        raise ConfigError(key, value, f"describes a model that cannot be built: {first_line(err)}") from err


def model_shape(cfg: ModelConfig, cache_dir: str | os.PathLike = ".cache") -> ModelShape | None:
    """The shape of ``cfg``'s model (None when its config cannot be read before the load). A
    random-weight config is built on the meta device (so that a shape transformers cannot build is
    refused here) and its blocks counted; a checkpoint's config (:func:`preload_config`) is read as
    its family's adapter reads it (:meth:`DecoderAdapter.block_config`), without importing the
    family's modeling code: the load does that."""
    if cfg.source == "local":
        check_safetensors_files("model.pretrained", cfg.pretrained)
    config = preload_config(cfg, cache_dir)
    if config is None:
        return None
    key, value = _named(cfg)
    model = meta_model(cfg, config) if cfg.source == "random" else None
    try:
        if model is not None:
            family = adapter_for(model)
            num_layers = family.num_layers
        else:
            family = adapter_class(config)
            num_layers = int(family.block_config(config).num_hidden_layers)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a family's structure the adapter cannot read
        raise ConfigError(key, value, f"has no blocks the adapter can read: {first_line(err)}") from err
    if num_layers < 2:
        raise ConfigError(key, value, f"has {num_layers} block(s); pruning needs at least 2")
    text = family.block_config(config)
    kv_heads = getattr(text, "num_key_value_heads", None)
    if kv_heads and text.num_attention_heads % kv_heads:
        reason = f"num_attention_heads={text.num_attention_heads} is not a multiple of num_key_value_heads={kv_heads}"
        raise ConfigError(*_named(cfg, "num_key_value_heads"), reason)
    positions = None if is_vision_config(cfg) else getattr(text, "max_position_embeddings", None)
    hidden = getattr(text, "hidden_size", None)
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
    if cfg.source == "random" and isinstance(vocab, int) and not is_vision_config(cfg):
        check_tokenizer_fits(cfg, vocab, cache_dir)
    return ModelShape(
        num_layers=num_layers,
        max_positions=positions,
        model=model,
        hidden_size=hidden,
        unfusable_reason=family.unfusable_reason,
        vocab_size=vocab if isinstance(vocab, int) else None,
    )


def _tokenizer_length(cfg: ModelConfig, cache_dir: str) -> int:
    key = (cfg.tokenizer, cache_dir)  # a random model's tokenizer is named, not its own
    if key not in _TOKENIZER_LENGTHS:
        _TOKENIZER_LENGTHS[key] = len(load_tokenizer(cfg, cache_dir))
    return _TOKENIZER_LENGTHS[key]


_TOKENIZER_LENGTHS: dict[tuple, int] = {}


def check_tokenizer_fits(cfg: ModelConfig, vocab_size: int, cache_dir: str | os.PathLike) -> None:
    """A random-weight model reads the ids of a tokenizer it does not own (``model.tokenizer``):
    its embedding must have a row for each of them, refused before the load otherwise."""
    tokens = _tokenizer_length(cfg, str(cache_dir))
    if tokens > vocab_size:
        reason = (
            f"the embedding has {vocab_size} rows, but the {cfg.tokenizer} tokenizer gives ids up to {tokens - 1}: "
            f"set at least {tokens}"
        )
        raise ConfigError("model.config.vocab_size", vocab_size, reason)
