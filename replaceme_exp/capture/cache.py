"""Content-addressed cache of capture results on disk.

The cache knows no kind of entry: it keeps any :class:`~replaceme_exp.capture.entry.CacheEntry` (an
accumulator, a cut's LS statistics, a selection's distances), each declared beside what it holds with its
kind and version. Keys are hashes of (model weights by content, calibration token ids, what was
captured, the entry's kind, version and identity): jobs that differ only in ``alpha``,
``regularizer`` or ``objective`` find the statistics of their cut here. Every entry carries its
whole key and a checksum over key and tensors (:func:`~replaceme_exp.storage.write_keyed_tensors`):
an entry copied over another's file name, corrupt or from an older version is reported, removed
and recomputed, never used. An entry's class bumps its ``version`` whenever the code changes what
that kind of entry holds. ``refresh=True`` (``force=true``) recomputes and overwrites instead
of reading. ``hits`` lists the kinds served. The cache only saves time: when an entry cannot be
written (a full disk), the job goes on without the cache.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


from replaceme_exp.capture import distributed
from replaceme_exp.capture.entry import CacheEntry, StoredValue
from replaceme_exp.storage import (
    content_key,
    file_lock,
    read_keyed_tensors,
    remove_dead_temporaries,
    write_keyed_tensors,
    write_optional,
)

log = logging.getLogger(__name__)

_swept: set[Path] = set()  # cache folders whose killed writers' leftovers this process removed


class StatisticsCache:
    """The entries of one model's captures over one data set; ``last_state`` (``capture.last_state``)
    enters every key when it is not ``block_output`` (the keys entries had before it existed)."""

    def __init__(
        self,
        root: str | os.PathLike,
        model_hash: str,
        data_hash: str,
        enabled: bool = True,
        refresh: bool = False,
        last_state: str = "block_output",
    ):
        self.root = Path(root)
        self.model_hash, self.data_hash, self.enabled, self.refresh = model_hash, data_hash, enabled, refresh
        self.captured = {} if last_state == "block_output" else {"last_state": last_state}
        self.writable = enabled  # False after a write failed (a full disk): no more attempts
        self.hits: list[str] = []
        if enabled and self.root not in _swept:
            _swept.add(self.root)
            remove_dead_temporaries(self.root)

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Held while a job looks up, computes and stores this cache's entries: an exclusive lock
        across processes and nodes (``<root>/locks/``, one per model, data set and captured state),
        so that a second job needing the same capture waits, then reads what the first one stored
        instead of computing it again. Nothing to hold when the cache is off, nor for the other ranks
        of a job of several processes (rank 0 holds it for them: they read what it reads)."""
        if not self.enabled or not distributed.is_leader():
            yield
            return
        name = content_key({"model": self.model_hash, "data": self.data_hash, **self.captured}, 24)

        def waiting() -> None:
            log.info("another job is capturing over the same model and data; waiting for its statistics")

        with file_lock(self.root / "locks" / f"{name}.lock", waiting):
            yield

    def _entry(self, entry: CacheEntry) -> tuple[Path, dict]:
        """The file of ``entry`` and its whole key."""
        kind = entry.kind
        if not kind:
            raise ValueError(f"{type(entry).__name__}.kind={kind!r}: name a kind of entry of its own")
        key = {"model": self.model_hash, "data": self.data_hash, "kind": kind, "version": entry.version}
        key.update(**self.captured, **entry.identity())
        return self.root / f"{kind}-{content_key(key, 24)}.pt", key

    def _load(self, entry: tuple[Path, dict]) -> dict | None:
        """The tensors of ``entry`` if it exists, holds its own key and its checksum holds; else
        None (a bad entry is reported with its path, removed and recomputed by the caller). In a
        capture shared by several ranks, rank 0 reads and every rank gets what it read (so all of
        them capture, or none)."""
        path, key = entry
        if not self.enabled or self.refresh:
            return None
        read = distributed.is_leader()
        payload = read_keyed_tensors(path, key, "statistics cache entry") if read else None
        if distributed.shared() is not None:
            payload = distributed.from_leader(payload, "sharing a statistics cache entry")
        if payload is not None:
            self.hits.append(key["kind"])
        return payload

    def _save(self, entry: tuple[Path, dict], payload: dict) -> None:
        """Write ``entry`` (rank 0 alone in a job of several processes)."""
        path, key = entry
        if (
            self.writable
            and distributed.is_leader()
            and not write_optional("statistics cache entry", path, lambda: write_keyed_tensors(path, key, payload))
        ):
            self.writable = False

    def restore(self, entry: CacheEntry) -> bool:
        """Whether an entry of ``entry``'s kind, version and identity was found; ``entry`` then holds it
        (:meth:`~replaceme_exp.capture.entry.CacheEntry.restore`)."""
        payload = self._load(self._entry(entry))
        if payload is not None:
            entry.restore(payload)
        return payload is not None

    def read(self, entry: StoredValue):
        """``entry``'s stored value (None: not stored)."""
        return entry.value if self.restore(entry) else None

    def store(self, entry: CacheEntry) -> None:
        """Keep what ``entry`` holds under its kind, version and identity."""
        state = {name: tensor.detach().cpu() for name, tensor in entry.state().items()}
        self._save(self._entry(entry), state)
