"""Scores of the unpruned model, computed once per (model weights, eval data, every eval setting,
metric) and reused. ``BASELINE_VERSION`` is part of every key: bump it when the code changes what a
baseline computes. Every entry carries its whole key and a checksum over key and value
(:func:`~replaceme_exp.storage.write_keyed_json`): another entry copied over its file name, a
corrupt one or one of an older version is reported, removed and recomputed, never used.
``refresh=True`` (``force=true``) recomputes and overwrites.

Parallel jobs asking for the same baseline compute it once: a miss takes a lock per key
(``.<key>.lock`` beside the entry), and whoever waited on it reads the entry the first one wrote."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from replaceme_exp.storage import (
    content_key,
    file_lock,
    read_keyed_json,
    remove_dead_temporaries,
    write_keyed_json,
    write_optional,
)

# 3: entries carry their key under a checksum over key and value. 4: the held-out perplexity window
# by window, lm-eval's scores item by item (what paired comparisons resample). 5: the per-token
# cross-entropy on (tokens, vocab) rows, nearer float64 (SmolLM2's held-out perplexity moved by 1.2e-4).
BASELINE_VERSION = 5


class BaselineCache:
    def __init__(self, root: str | os.PathLike, refresh: bool = False):
        self.root = Path(root)
        self.refresh = refresh
        self.hits: list[str] = []  # the ``metric`` of each key served from the cache
        remove_dead_temporaries(self.root)

    def get_or_compute(self, key: dict, compute: Callable[[], Any]) -> Any:
        """The cached value for ``key`` (a float or a JSON-able dict of scores), computing and
        storing it (atomically) on a miss."""
        path, key = self._path(key)
        if not self.refresh and (value := self._read(path, key)) is not None:
            return value
        waited = []
        with file_lock(path.with_name(f".{path.stem}.lock"), lambda: waited.append(True)):
            # another job computed it while this one waited (a forced job recomputes only once too)
            if (not self.refresh or waited) and (value := self._read(path, key)) is not None:
                return value
            value = compute()
            self._write(path, key, value)
        return value

    def _read(self, path: Path, key: dict) -> Any:
        value = read_keyed_json(path, key, "baseline cache entry")
        if value is not None:
            self.hits.append(str(key.get("metric", "harness")))
        return value

    def _path(self, key: dict) -> tuple[Path, dict]:
        key = {**key, "version": BASELINE_VERSION}
        return self.root / f"{content_key(key, 24)}.json", key

    def put(self, key: dict, value: Any) -> None:
        """Store ``value`` for ``key`` (computed by the caller anyway), overwriting."""
        path, key = self._path(key)
        self._write(path, key, value)

    def _write(self, path: Path, key: dict, value: Any) -> None:
        write_optional("baseline cache entry", path, lambda: write_keyed_json(path, key, value))
