"""Errors that name the config key and value a user has to change."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Bad user input: says which key, which value, and what would work instead."""

    def __init__(self, key: str, value: Any, reason: str):
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"{key}={value!r}: {reason}")


class UnsupportedModelError(ConfigError):
    """A model family with no adapter, or one whose structure makes fusion inexact."""
