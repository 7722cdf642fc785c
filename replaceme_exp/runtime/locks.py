"""One job per configuration at a time, across processes and nodes sharing a results folder."""

from __future__ import annotations

import fcntl
import logging
import os
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("replaceme_exp.job")


@contextmanager
def config_lock(results_dir: str | os.PathLike, config_hash: str):
    """An exclusive ``flock`` on ``results_dir/locks/<config_hash>.lock``: a second identical job
    waits, then finds the first one's finished row and skips."""
    directory = Path(results_dir) / "locks"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{config_hash}.lock", "a+") as handle:
        locked = True
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("an identical job (config_hash=%s) is running; waiting for it", config_hash)
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as err:  # a filesystem without flock (Lustre noflock, some NFS/FUSE mounts)
            log.warning("no lock on %s (%s): identical jobs started at once may both run", directory, err)
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)
