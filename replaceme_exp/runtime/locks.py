"""One job per configuration at a time, across processes and nodes sharing a results folder."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

from replaceme_exp.storage import file_lock

log = logging.getLogger("replaceme_exp.job")


@contextmanager
def config_lock(results_dir: str | os.PathLike, config_hash: str):
    """An exclusive ``flock`` on ``results_dir/locks/<config_hash>.lock``: a second identical job
    waits, then finds the first one's finished row and skips."""

    def waiting() -> None:
        log.info("an identical job (config_hash=%s) is running; waiting for it", config_hash)

    with file_lock(Path(results_dir) / "locks" / f"{config_hash}.lock", waiting):
        yield
