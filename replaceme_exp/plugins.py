"""Plugins from other installed packages, found through entry points as pytest's and lm-eval's are.

A package adds to the harness by declaring, in its ``pyproject.toml``::

    [project.entry-points."replaceme_exp.plugins"]
    my_method = "my_package.my_method"        # a module: importing it registers what it defines

    [project.entry-points."replaceme_exp.conf"]
    my_package = "my_package.conf"            # a package whose folder holds config groups

- ``replaceme_exp.plugins``: each entry names a module that registers a method, a selection metric, an
  estimator, a calibration source or a model family when imported, exactly as a module dropped into the
  project's own extension folders does (``replaceme_exp/methods/``, ...). Every plugin module is imported
  once, with the method plugins (:mod:`replaceme_exp.methods`), before any configuration is checked.
- ``replaceme_exp.conf``: each entry names a package whose folder holds options of the config groups
  (``objective/<name>.yaml``, ``experiment/<name>.yaml``, ...), put on Hydra's search path after the
  project's own ``conf/``.

A plugin's package may then be named by an ``objective._target_`` (the estimators a configuration may
instantiate are the project's and its plugins'). A plugin that fails to import stops the run in one line
naming its entry point.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import EntryPoint, entry_points

PLUGIN_GROUP = "replaceme_exp.plugins"
CONF_GROUP = "replaceme_exp.conf"


class PluginError(RuntimeError):
    """An installed plugin that cannot be loaded."""


def declared(group: str) -> list[EntryPoint]:
    """The entry points installed packages declare in ``group``, by name."""
    return sorted(entry_points(group=group), key=lambda e: e.name)


@functools.cache
def load_plugins() -> tuple[str, ...]:
    """Import every plugin module (once per process) and put the plugins' config packages on Hydra's
    search path. Returns the plugin modules imported."""
    loaded = []
    for entry in declared(PLUGIN_GROUP):
        try:
            importlib.import_module(entry.module)
        except Exception as err:  # noqa: BLE001 - whatever the plugin raised, one line naming it
            raise PluginError(
                f"plugin {entry.name} ({entry.value}, group {PLUGIN_GROUP}) failed to load: {type(err).__name__}: {err}"
            ) from err
        loaded.append(entry.module)
    if declared(CONF_GROUP):
        register_config_search_path()
    return tuple(loaded)


@functools.cache
def plugin_packages() -> tuple[str, ...]:
    """The top-level packages of the installed plugins (whose classes a configuration may name)."""
    return tuple(sorted({e.module.split(".")[0] for group in (PLUGIN_GROUP, CONF_GROUP) for e in declared(group)}))


def config_packages() -> list[str]:
    """The packages of the plugins' config groups, in entry-point name order."""
    return [entry.module for entry in declared(CONF_GROUP)]


def register_config_search_path() -> None:
    """Have Hydra look for config options in the plugins' config packages (idempotent)."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(_plugin_search_path())


@functools.cache
def _plugin_search_path() -> type:
    from hydra.core.config_search_path import ConfigSearchPath
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    class PluginConfigs(SearchPathPlugin):
        """The ``replaceme_exp.conf`` entry points' packages, after the project's own options."""

        def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
            for package in config_packages():
                search_path.append(provider="replaceme_exp-plugin", path=f"pkg://{package}")

    return PluginConfigs
