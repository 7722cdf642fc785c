"""What the statistics cache keeps: a :class:`CacheEntry` names its kind, version and identity, and turns
what it holds into named tensors and back. The cache knows no kind: each is declared by what holds it.

An :class:`~replaceme_exp.capture.accumulator.Accumulator` is an entry that also accumulates over the
capture; :class:`StoredValue` is one for a value computed elsewhere (a selection's candidate distances, a
cut's LS statistics), read back with :meth:`~replaceme_exp.capture.cache.StatisticsCache.read`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

# kind -> the class that declared it: two classes may not share a kind (their entries would collide)
ENTRY_KINDS: dict[str, type] = {}


class CacheEntry:
    """One entry of the statistics cache (module docstring)."""

    kind: ClassVar[str] = ""  # the entry's kind: a file-name prefix, one per kind of statistic
    version: ClassVar[int] = 1  # bump when the code changes what an entry of this kind holds

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if not kind:
            return  # an abstract entry, or one that inherits its parent's kind
        owner = ENTRY_KINDS.setdefault(kind, cls)
        same = (owner.__module__, owner.__qualname__) == (cls.__module__, cls.__qualname__)  # a module reloaded
        if owner is not cls and not same:
            raise ValueError(f"{cls.__qualname__}.kind={kind!r}: {owner.__qualname__} keeps entries of that kind")
        ENTRY_KINDS[kind] = cls

    def identity(self) -> dict[str, Any]:
        """What sets this entry apart from another of its kind over the same model and data (JSON values)."""
        raise NotImplementedError

    def state(self) -> dict[str, torch.Tensor]:
        """What it holds, as named tensors (on the CPU when stored)."""
        raise NotImplementedError

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        """Hold ``state`` (a cache entry's tensors, on the CPU)."""
        raise NotImplementedError


class StoredValue(CacheEntry):
    """An entry whose ``value`` was computed elsewhere: a subclass is a dataclass whose fields say which
    entry it is and whose last field is ``value`` (None until stored or restored)."""

    value: Any
