"""Scores of the unpruned model, computed once per (model weights, eval data, every eval setting,
metric) and reused. ``BASELINE_VERSION`` is part of every key: bump it when the code changes what a
baseline computes. ``refresh=True`` (``force=true``) recomputes and overwrites."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from replaceme_exp.storage import content_key, write_text

BASELINE_VERSION = 2
log = logging.getLogger(__name__)


def _digest(value: Any) -> str:
    return content_key(value)


class BaselineCache:
    def __init__(self, root: str | os.PathLike, refresh: bool = False):
        self.root = Path(root)
        self.refresh = refresh
        self.hits: list[str] = []  # the ``metric`` of each key served from the cache

    def get_or_compute(self, key: dict, compute: Callable[[], Any]) -> Any:
        """The cached value for ``key`` (a float or a JSON-able dict of scores), computing and
        storing it (atomically) on a miss."""
        path, key = self._path(key)
        if path.is_file() and not self.refresh:
            try:
                entry = json.loads(path.read_text())
                if entry.get("sha256") != _digest(entry["value"]):
                    raise ValueError("checksum mismatch")
            except Exception as err:  # noqa: BLE001 - truncated JSON, a flipped bit, a missing field
                log.warning("corrupt baseline cache entry %s (%s): removed, recomputing", path, err)
                path.unlink(missing_ok=True)
            else:
                self.hits.append(str(key.get("metric", "harness")))
                return entry["value"]
        value = compute()
        self._write(path, key, value)
        return value

    def _path(self, key: dict) -> tuple[Path, dict]:
        key = {**key, "version": BASELINE_VERSION}
        return self.root / f"{content_key(key, 24)}.json", key

    def put(self, key: dict, value: Any) -> None:
        """Store ``value`` for ``key`` (computed by the caller anyway), overwriting."""
        path, key = self._path(key)
        self._write(path, key, value)

    def _write(self, path: Path, key: dict, value: Any) -> None:
        write_text(path, json.dumps({"key": key, "value": value, "sha256": _digest(value)}))
