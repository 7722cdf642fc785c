"""Files that are whole or absent, and keys that name content.

Every file the project writes for later reading (rows, cache entries, baselines, generated data,
memos, status files) goes through :func:`atomic_path`: it is written to a temporary file beside its
target and renamed over it, so a reader never sees half a file and a killed or full-disk write
leaves none. Every cache key is :func:`content_key` of what the entry depends on.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def content_key(value: Any, length: int | None = None) -> str:
    """SHA-256 of ``value`` as canonical JSON (keys sorted; non-JSON values by ``str``), hex,
    cut to ``length`` characters."""
    digest = hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
    return digest if length is None else digest[:length]


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends
    without an error, removed otherwise (its parent folder is created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` to ``path``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` to ``path``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json(path: str | os.PathLike, value: Any) -> Path:
    """``value`` as JSON to ``path``, atomically (non-JSON values by ``str``)."""
    return write_text(path, json.dumps(value, default=str))
