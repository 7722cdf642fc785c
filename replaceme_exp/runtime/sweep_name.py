"""What a job belongs to, by name: the sweep as launched, not the job's own preset.

A sweep over several presets (``python run.py -m experiment=replaceme_ls,uidl_baseline``) is one
sweep: every one of its jobs is named ``experiment=replaceme_ls,uidl_baseline`` (its rows' ``sweep_name``,
the report's sweep page, W&B's group), not after the preset the job itself got (the first job's
``experiment/replaceme_ls`` once titled a UIDL-vs-ReplaceMe page). The sweep's overrides are read from
the ``multirun.yaml`` Hydra writes into the sweep directory before any job starts (on every launcher: a
SLURM node reads the shared folder).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

# The groups that name a whole experiment, most encompassing first: a paper template, a study, a comparison of
# methods, a method preset.
PRESET_GROUPS = ("paper", "study", "methods", "experiment")


def sweep_name(choices: dict, multirun: bool, sweep_overrides: list[str] | None = None) -> str:
    """The name of what a job belongs to: for the first of :data:`PRESET_GROUPS` that the sweep's
    overrides sweep over, ``<group>=<a>,<b>``; else the first the job chose, ``<group>/<name>``
    (a template: ``paper/clip``, whatever it sweeps inside); else ``sweep`` / ``single``.
    ``choices``: the job's config group choices; ``sweep_overrides``: the whole sweep's
    (:func:`sweep_overrides`)."""
    swept = swept_presets(sweep_overrides or [])
    for group in PRESET_GROUPS:
        if group in swept:
            return f"{group}={','.join(swept[group])}"
        if choices.get(group):
            return f"{group}/{choices[group]}"
    return "sweep" if multirun else "single"


def swept_presets(overrides: list[str]) -> dict[str, list[str]]:
    """``{group: [option, ...]}`` for each of :data:`PRESET_GROUPS` that ``overrides`` sweep over
    (``experiment=a,b``, ``+paper=choice(x,y)``); overrides Hydra cannot parse are left out."""
    out: dict[str, list[str]] = {}
    parser = OverridesParser.create()
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except Exception:  # noqa: BLE001 - Hydra parses the sweep itself and reports its own errors
            continue
        group = override.key_or_group.lstrip("+~")
        if group in PRESET_GROUPS and override.is_sweep_override():
            out[group] = list(override.sweep_string_iterator())
    return out


def sweep_overrides(sweep_dir: str | Path) -> list[str]:
    """The sweep's overrides as launched (the command line's, then a template's
    ``hydra.sweeper.params``), from ``<sweep_dir>/multirun.yaml``; [] when it cannot be read."""
    path = Path(sweep_dir) / "multirun.yaml"
    try:
        hydra = OmegaConf.to_container(OmegaConf.load(path), resolve=False).get("hydra") or {}
    except Exception as err:  # noqa: BLE001 - the name falls back to the job's own presets
        log.debug("no sweep overrides from %s: %s", path, err)
        return []
    task = list((hydra.get("overrides") or {}).get("task") or [])
    params = (hydra.get("sweeper") or {}).get("params") or {}
    return [str(o) for o in task] + [f"{k}={v}" for k, v in params.items()]
