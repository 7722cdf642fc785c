"""Scores of the unpruned model, computed once per (model, eval text, metric) and reused."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable


class BaselineCache:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def get_or_compute(self, key: dict, compute: Callable[[], Any]) -> Any:
        """The cached value for ``key`` (a float or a JSON-able dict of scores), computing and
        storing it (atomically) on a miss."""
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        path = self.root / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())["value"]
        value = compute()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "value": value}))
        os.replace(tmp, path)
        return value
