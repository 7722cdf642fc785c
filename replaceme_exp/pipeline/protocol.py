"""The protocol axis: the paper's text (``protocol=paper``) or what the official code ran
(``protocol=official``, mts-ai/ReplaceMe, which produced the paper's numbers).

Each difference is one :class:`ProtocolSetting`: a configuration key, the value the paper's text
implies (this project's default), the official code's value, and why. :func:`apply_protocol`
turns a configuration into the one that runs: under ``protocol=official`` every listed key that
holds the paper's value takes the official one; a key set to anything else keeps it (an explicit
choice, e.g. ``selection=cka``). A key the configuration does not have (``calibration.order`` of a
plain-text source) is left alone. So ``protocol=official`` is one switch on every template, and
the row shows each setting as it ran.

Not here, because they already hold under both protocols: lm-eval's few-shot seed 1234
(``eval.harness.fewshot_seed``), closed-form LS in float64, the Adam recipe.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from replaceme_exp.config import schema
from replaceme_exp.estimation.estimators import Requirements

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ProtocolSetting:
    """``path``: the key (dots into groups); ``paper`` / ``official``: its value under each
    protocol (``official`` may be a function of the configuration); ``why``: where the official
    code does it."""

    path: str
    paper: Any
    official: Any
    why: str

    def official_value(self, config: schema.JobConfig, requirements: Requirements) -> Any:
        return self.official(config, requirements) if callable(self.official) else self.official


def _padded_with_every_token(config: schema.JobConfig, requirements: Requirements) -> bool:
    """Padded positions join a fit of every token; a token rule (``rescale_massive``, ...) picks
    tokens by their sequence and keeps them out."""
    return config.estimation.tokens == "all"


def _numerical_multi_lt(config: schema.JobConfig, requirements: Requirements) -> str:
    """The official LS pipeline estimates every T from the unpruned model in one pass; its cosine
    (numerical) pipeline reloads the saved, already pruned model for each cut."""
    return "sequential" if requirements.tokens else "independent"

OFFICIAL: tuple[ProtocolSetting, ...] = (
    ProtocolSetting(
        "selection",
        {"metric": "cosine", "tokens": "all"},
        {"metric": "angular", "tokens": "last"},
        "distance.py: angular distance arccos(cos)/pi at each sequence's last non-padding token",
    ),
    ProtocolSetting("calibration.order", "shuffled", "first", "utils.py: the first dataset_size records, in order"),
    ProtocolSetting("calibration.chat_turns", "all", "first_pair", "utils.py _load_orca_dataset: the first pair"),
    ProtocolSetting(
        "calibration.batch_order", "by_length", "as_read", "utils.py: DataLoader(shuffle=False) over the records"
    ),
    ProtocolSetting("calibration.drop_last", False, True, "utils.py: DataLoader(drop_last=True)"),
    ProtocolSetting(
        "estimation.padded_positions",
        False,
        _padded_with_every_token,
        "lstsq.py / cosine_dist.py: view(-1, hidden) of padded batches keeps the padded positions",
    ),
    ProtocolSetting(
        "model.capture_dtype", None, "float32", "from_pretrained without torch_dtype: activations in float32"
    ),
    ProtocolSetting("model.dtype", "float32", "bfloat16", "the pruned model is fused into and saved in bfloat16"),
    ProtocolSetting("model.dtype", "float16", "bfloat16", "the pruned model is fused into and saved in bfloat16"),
    ProtocolSetting(
        "solver_schedule", "full_batch", "minibatch", "utils.py optimizing_method: one step per 1024-token batch"
    ),
    ProtocolSetting(
        "objective.schedule", "full_batch", "minibatch", "utils.py optimizing_method: one step per 1024-token batch"
    ),
    ProtocolSetting(
        "objective.precision",
        "float64",
        "float32",
        "utils.py optimizing_method: torchmin's solvers on float32 activations and a float32 T",
    ),
    ProtocolSetting(
        "multi_lt", "independent", _numerical_multi_lt, "cosine_dist.py reloads the pruned model for each cut"
    ),
    ProtocolSetting(
        "touching_cuts",
        "apart",
        "compose",
        "select_non_overlapping_blocks lets unmerged cuts touch; lstsq.py fuses both T into one down-projection",
    ),
)


def apply_protocol(config: schema.JobConfig, requirements: Requirements) -> schema.JobConfig:
    """``config`` as it runs under its ``protocol`` (unchanged for ``paper``), its estimator
    declaring ``requirements``. Logs what moved."""
    if config.protocol != "official":
        return config
    moved = []
    for setting in OFFICIAL:
        current = _get(config, setting.path)
        if current is _MISSING or not _equal(current, setting.paper):
            continue
        value = setting.official_value(config, requirements)
        if _equal(current, value):
            continue
        config = _set(config, setting.path, value)
        moved.append(f"{setting.path}={_short(value)}")
    config = _apply_to_mix_parts(config)
    if moved:
        log.info("protocol=official: %s", ", ".join(moved))
    return config


def _apply_to_mix_parts(config: schema.JobConfig) -> schema.JobConfig:
    """The parts of a ``mix`` take the official record order and chat turns too."""
    parts = getattr(config.calibration, "parts", None)
    if not isinstance(parts, dict):
        return config
    changed = {}
    for name, part in parts.items():
        part = dict(part)
        for key in ("order", "chat_turns"):
            setting = next(s for s in OFFICIAL if s.path == f"calibration.{key}")
            if part.get(key, setting.paper) == setting.paper:
                part[key] = setting.official
        changed[name] = part
    return _set(config, "calibration.parts", changed)


_MISSING = object()


def _get(config: Any, path: str) -> Any:
    value = config
    for name in path.split("."):
        if not dataclasses.is_dataclass(value) or not hasattr(value, name):
            return _MISSING
        value = getattr(value, name)
    return value


def _set(config: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    if not rest:
        if isinstance(value, dict) and dataclasses.is_dataclass(getattr(config, head)):
            value = dataclasses.replace(getattr(config, head), **value)
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: _set(getattr(config, head), rest, value)})


def _equal(current: Any, paper: Any) -> bool:
    if isinstance(paper, dict):
        return dataclasses.is_dataclass(current) and all(getattr(current, k, None) == v for k, v in paper.items())
    return current == paper


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}={v}" for k, v in value.items()) + ")"
    return str(value)
