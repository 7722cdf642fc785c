"""Which classes a configuration may have Hydra instantiate.

Hydra instantiates every ``_target_`` under ``hydra.callbacks``, ``hydra.launcher`` and
``hydra.sweeper`` before a job runs: a shared sweep file or a ``--config-dir`` option could name
any callable there. :func:`guard_hydra_targets` makes Hydra refuse, in one line and before
instantiating anything, a target outside the project's and Hydra's own packages. (Whoever types
the command line can still run anything: by Hydra's design it is a shell.) The objective's
``_target_`` is held to the project's own estimators by
:func:`~replaceme_exp.pipeline.spec.estimator_class`.
"""

from __future__ import annotations

import functools
import logging
import sys

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("replaceme_exp")

ALLOWED_HYDRA_TARGET_PREFIXES = ("replaceme_exp.", "hydra.", "hydra_plugins.")
HYDRA_TARGET_NODES = ("callbacks", "launcher", "sweeper")


def foreign_targets(config: DictConfig) -> list[tuple[str, str]]:
    """``(key, target)`` of every ``_target_`` under Hydra's instantiated nodes outside the allowed packages."""
    hydra_node = OmegaConf.to_container(config.hydra, resolve=False) if "hydra" in config else {}
    found, stack = [], [(f"hydra.{name}", hydra_node.get(name)) for name in HYDRA_TARGET_NODES]
    while stack:
        key, node = stack.pop()
        if isinstance(node, dict):
            target = node.get("_target_")
            allowed = isinstance(target, str) and target.startswith(ALLOWED_HYDRA_TARGET_PREFIXES)
            if target is not None and not allowed:
                found.append((f"{key}._target_", str(target)))
            stack += [(f"{key}.{k}", v) for k, v in node.items() if k != "_target_"]
    return sorted(found)


def guard_hydra_targets() -> None:
    """Make Hydra's callbacks (created before any launcher, sweeper or job) refuse a configuration
    with a foreign target: one logged line and exit code 2. Idempotent."""
    from hydra._internal.callbacks import Callbacks

    original = Callbacks.__init__
    if getattr(original, "guarded", False):
        return

    @functools.wraps(original)
    def checked(self, config: DictConfig | None = None) -> None:
        if config is not None and (foreign := foreign_targets(config)):
            key, target = foreign[0]
            logging.basicConfig(format="%(message)s")
            log.error(
                "invalid configuration: %s=%r: only the project's and Hydra's classes (%s) are instantiated",
                key,
                target,
                ", ".join(p + "*" for p in ALLOWED_HYDRA_TARGET_PREFIXES),
            )
            sys.exit(2)
        original(self, config)

    checked.guarded = True
    Callbacks.__init__ = checked
