"""Hydra callbacks of a run or sweep (``hydra.callbacks`` in ``conf/config.yaml``)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.pipeline.rules import writable_directory

log = logging.getLogger("replaceme_exp")


class DirectoryCheck(Callback):
    """``results_dir``, ``cache_dir`` and Hydra's own run (or sweep) directory checked before Hydra
    creates that directory under ``results_dir`` (which would otherwise fail first, with a
    traceback): one line and exit code 2."""

    def _check(self, config: DictConfig, hydra_dir: str) -> None:
        try:
            for key in ("results_dir", "cache_dir", hydra_dir):
                writable_directory(key, OmegaConf.select(config, key))
        except Exception as err:  # noqa: BLE001 - ConfigError, or an interpolation that cannot resolve
            log.error("invalid configuration: %s", str(err).splitlines()[0])
            sys.exit(2)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")
