"""Settings left to the protocol, and the rules that settle them.

``protocol`` is a config group (``conf/protocol/paper.yaml``, ``official.yaml``): its fixed values
compose like any other option, so ``python run.py protocol=official --cfg job`` prints them, and a
choice typed on the command line, a preset or a template wins over them. A setting whose official
value depends on other keys is left to the protocol in the schema (``null``; ``auto`` for
``model.capture_dtype``) and settled by a rule that the module owning the setting registers with
:func:`protocol_rule`: the calibration source's record order, the fit's padded positions, the
numerical objectives' precision and multi-LT order, the capture copy's dtype, the last block's
state in the capture. A value given anywhere is a choice and is kept.

:func:`settle` runs every rule on a typed configuration (:func:`~replaceme_exp.config.validate.typed_config`
calls it), so no configuration leaves validation with a setting unsettled; it logs what the
official protocol filled in, and the row records every setting as it ran.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

from replaceme_exp.config import schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProtocolRule:
    """``settle(config)`` returns ``{key: value}`` (dots into groups) for the keys of ``keys`` that
    ``config`` leaves to the protocol, as its ``protocol`` runs them."""

    keys: tuple[str, ...]
    settle: Callable[[schema.JobConfig], dict[str, Any]]


RULES: list[ProtocolRule] = []


def protocol_rule(*keys: str) -> Callable:
    """Register the decorated ``rule(config) -> {key: value}`` as the one that settles ``keys``."""

    def register(rule: Callable[[schema.JobConfig], dict[str, Any]]) -> Callable:
        taken = {k for r in RULES for k in r.keys} & set(keys)
        if taken and not any(r.settle is rule for r in RULES):
            raise ValueError(f"{sorted(taken)} are settled by another rule already")
        if not any(r.settle is rule for r in RULES):
            RULES.append(ProtocolRule(tuple(keys), rule))
        return rule

    return register


def left_to_protocol(config: Any, key: str) -> bool:
    """Whether ``key`` (dots into groups) exists on ``config`` and holds the value that leaves it to
    the protocol."""
    value = value_at(config, key)
    return value is not _ABSENT and value == LEFT_TO_PROTOCOL[key]


def settle(config: schema.JobConfig) -> schema.JobConfig:
    """``config`` with every setting left to the protocol settled by its rule. Raises LookupError
    when one is left with no rule to settle it (the module that registers it was not imported)."""
    filled: dict[str, Any] = {}
    for rule in RULES:
        for key, value in rule.settle(config).items():
            if key not in rule.keys:
                raise ValueError(f"a protocol rule of {rule.keys} set {key}")
            config = replaced_at(config, key, value)
            filled[key] = value
    unsettled = [k for k in LEFT_TO_PROTOCOL if left_to_protocol(config, k)]
    if unsettled:
        raise LookupError(f"no protocol rule settled {unsettled} (import replaceme_exp.pipeline first)")
    if config.protocol != "paper" and filled:
        log.info("protocol=%s: %s", config.protocol, ", ".join(f"{k}={v}" for k, v in filled.items()))
    return config


# Every key the schema leaves to the protocol, and the value that leaves it (its schema default).
LEFT_TO_PROTOCOL: dict[str, Any] = {
    "calibration.order": None,
    "calibration.chat_turns": None,
    "calibration.batch_order": None,
    "calibration.drop_last": None,
    "calibration.empty_records": None,
    "calibration.mix_order": None,
    "capture.last_state": None,
    "estimation.padded_positions": None,
    "model.capture_dtype": "auto",  # null: the model's dtype, a choice
    "objective.precision": None,
    "objective.solver_backend": None,
    "objective.mse_reduction": None,
    "multi_lt": None,
    "eval.harness.batch_size": None,
}

_ABSENT = object()


def value_at(config: Any, key: str) -> Any:
    value = config
    for name in key.split("."):
        if not dataclasses.is_dataclass(value) or not hasattr(value, name):
            return _ABSENT
        value = getattr(value, name)
    return value


def replaced_at(config: Any, key: str, value: Any) -> Any:
    """A copy of the dataclass ``config`` with ``key`` (dots into groups) set to ``value``."""
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: replaced_at(getattr(config, head), rest, value)})
