"""Registries at the extension points: a name in a config (``selection.metric=cka``,
``calibration.source=pydoc``, ...) names one registered implementation, registered where it is
defined (``@METRICS.register("cka")``), so adding one is one file.

A registry knows the config key that names its entries: an unknown name is refused with one
line listing what exists, and the config schema declares ``choices=<key>`` to check the value
before anything loads (:mod:`replaceme_exp.config.validate`). Registries are looked up by that
key; the stage packages that fill them are imported before a configuration is validated.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, Iterator, TypeVar

from replaceme_exp.errors import ConfigError

T = TypeVar("T")

_BY_KEY: dict[str, "Registry"] = {}


class Registry(Generic[T]):
    """Named implementations of one extension point, e.g. the selection metrics.

    ``key``: the config key whose value names an entry (``selection.metric``); ``what``: what an
    entry is, for messages."""

    def __init__(self, key: str, what: str):
        if key in _BY_KEY:
            raise ValueError(f"a registry for {key} exists already")
        self.key, self.what = key, what
        self._entries: dict[str, T] = {}
        _BY_KEY[key] = self

    def register(self, name: str, entry: T | None = None) -> Callable[[T], T] | T:
        """``@registry.register("name")`` on a class or function, or ``registry.register(name, entry)``."""

        def add(value: T) -> T:
            if name in self._entries and self._entries[name] is not value:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._entries[name] = value
            return value

        return add if entry is None else add(entry)

    def remove(self, name: str) -> None:
        """Unregister ``name`` (a test's temporary entry)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The entry called ``name``; a name nobody registered is refused naming the key."""
        if name not in self._entries:
            raise ConfigError(self.key, name, f"choose one of {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(sorted(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def registry(key: str) -> Registry:
    """The registry whose entries ``key`` names (its package must have been imported)."""
    if key not in _BY_KEY:
        raise LookupError(f"no registry for {key} is loaded (import the stage packages first)")
    return _BY_KEY[key]


def import_submodules(package: str) -> None:
    """Import every module of ``package`` (so that each registers what it defines: dropping a file
    into an extension package is enough to add an entry)."""
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__):
        importlib.import_module(f"{package}.{info.name}")
