"""Errors that name the config key and value a user has to change."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Bad user input: says which key, which value, and what would work instead."""

    def __init__(self, key: str, value: Any, reason: str):
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"{key}={value!r}: {reason}")


def first_line(err: BaseException, limit: int = 200) -> str:
    """An error's message on one line: its first line, or its first two when the first ends in a
    colon (transformers' validators put the reason on the second), cut to ``limit`` characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    text = lines[0] if not lines[0].endswith(":") or len(lines) == 1 else f"{lines[0]} {lines[1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class UnsupportedModelError(ConfigError):
    """A model family with no adapter, or one whose structure makes fusion inexact."""


class NonFiniteError(FloatingPointError):
    """NaN or inf where a number must be finite: names the stage and the quantity."""

    def __init__(self, stage: str, what: str):
        self.stage, self.what = stage, what
        super().__init__(f"stage {stage}: {what} not finite (NaN or inf)")


def check_finite(stage: str, what: str, values) -> None:
    """Raise :class:`NonFiniteError` unless every value (numbers or tensors) is finite."""
    import math

    import torch

    for value in values:
        if isinstance(value, torch.Tensor):
            if not bool(torch.isfinite(value).all()):
                raise NonFiniteError(stage, what)
        elif value is None or not math.isfinite(float(value)):
            raise NonFiniteError(stage, what)
