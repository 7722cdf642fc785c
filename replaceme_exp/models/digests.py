"""Files by content: SHA-256 digests memoised by the file's stat stamp.

A digest is memoised under ``memo_dir`` by the file's stamp (real path, size, mtime, inode and
ctime), so a later job costs one ``stat`` per file while a file replaced or rewritten in place is
hashed again: a rewrite changes the ctime even when size, inode and mtime are restored (``utime``
cannot set the ctime). Each memo carries its stamp and a checksum
(:func:`~replaceme_exp.storage.write_keyed_json`): a memo copied over another's name, corrupt or
in an older format is reported, removed and the file hashed again.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from replaceme_exp.storage import content_key, read_keyed_json, write_keyed_json, write_optional

log = logging.getLogger(__name__)

# Files whose content makes the model's activations what they are.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model")


def file_stamp(path: str | os.PathLike) -> dict:
    """What tells a file's content apart without reading it: real path, size, mtime, inode, ctime."""
    real = Path(path).resolve()
    stat = real.stat()
    return {
        "path": str(real),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ino": stat.st_ino,
        "ctime_ns": stat.st_ctime_ns,
    }


def file_digest(path: str | os.PathLike, memo_dir: str | os.PathLike | None = None) -> str:
    """SHA-256 of the file's content, memoised by its :func:`file_stamp` under ``memo_dir``."""
    stamp = file_stamp(path)
    memo = None
    if memo_dir is not None:
        memo = Path(memo_dir) / (content_key(stamp, 24) + ".json")
        known = read_keyed_json(memo, stamp, "fingerprint memo")
        if isinstance(known, str):
            return known
    real = Path(stamp["path"])
    if stamp["size"] > 2**30:
        log.info("fingerprinting %s (%.1f GB) once", real, stamp["size"] / 2**30)
    h = hashlib.sha256()
    with open(real, "rb") as f:
        while chunk := f.read(2**24):
            h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:  # a read-only or full cache only costs the memo
        write_optional("fingerprint memo", memo, lambda: write_keyed_json(memo, stamp, digest))
    return digest


def concatenation_digest(paths: list[str | os.PathLike], memo_dir: str | os.PathLike | None = None) -> str:
    """SHA-256 of the files' contents one after another (a file shipped in parts), memoised by
    the stamps of all of them (a part replaced or rewritten is read again); for one file, its
    :func:`file_digest` (the same memo)."""
    if len(paths) == 1:
        return file_digest(paths[0], memo_dir)
    stamps = [file_stamp(path) for path in paths]
    key = {"concatenation": stamps}
    memo = None
    if memo_dir is not None:
        memo = Path(memo_dir) / (content_key(key, 24) + ".json")
        known = read_keyed_json(memo, key, "fingerprint memo")
        if isinstance(known, str):
            return known
    h = hashlib.sha256()
    for stamp in stamps:
        with open(stamp["path"], "rb") as f:
            while chunk := f.read(2**24):
                h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:
        write_optional("fingerprint memo", memo, lambda: write_keyed_json(memo, key, digest))
    return digest


def directory_digest(directory: str | os.PathLike, memo_dir: str | os.PathLike | None = None) -> str:
    """One digest over the weight and config files of a checkpoint directory (names and contents)."""
    root = Path(directory)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    h = hashlib.sha256()
    for file in files:
        h.update(str(file.relative_to(root)).encode())
        h.update(file_digest(file, memo_dir).encode())
    return h.hexdigest()
