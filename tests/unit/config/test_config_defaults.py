"""Defaults live in the schema alone: no YAML option sets a key to the value its defaults list (its
schema shape, and the options it extends) already gives it."""

from __future__ import annotations

import copy
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import replaceme_exp.pipeline  # noqa: F401  (the schema in Hydra's ConfigStore)


CONF = Path(__file__).resolve().parents[3] / "conf"


def stored(path: str) -> dict:
    """A schema shape as stored in Hydra's ConfigStore (``/schema/<group>/<shape>``): its keys and defaults."""
    *folders, name = path.strip("/").split("/")
    repo = ConfigStore.instance().repo
    for folder in folders:
        repo = repo[folder]
    return OmegaConf.to_container(repo[f"{name}.yaml"].node, resolve=False)


def merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def parts(option: Path) -> tuple[dict, list]:
    """An option's own values and its defaults list."""
    raw = OmegaConf.to_container(OmegaConf.load(option), resolve=False)
    return {k: v for k, v in raw.items() if k != "defaults"}, raw.get("defaults") or []


def inherited(option: Path) -> dict:
    """What ``option``'s defaults list composes to before its own values (``_self_``)."""
    out: dict = {}
    for entry in parts(option)[1]:
        if entry == "_self_":
            break
        if isinstance(entry, str) and entry.startswith("/schema/"):
            out = merged(out, stored(entry.split("@")[0]))
        elif isinstance(entry, str) and (option.parent / f"{entry}.yaml").is_file():
            parent = option.parent / f"{entry}.yaml"
            out = merged(out, merged(inherited(parent), parts(parent)[0]))
    return out


def restated(option: Path) -> list[str]:
    """The keys ``option`` sets to the value it inherits (dotted for nested keys)."""
    found: list[str] = []

    def walk(values: dict, defaults: dict, prefix: str) -> None:
        for k, v in values.items():
            if k not in defaults:
                continue
            if isinstance(v, dict) and isinstance(defaults[k], dict) and v != defaults[k]:
                walk(v, defaults[k], f"{prefix}{k}.")
            elif v == defaults[k] and v != "???":
                found.append(f"{prefix}{k}")

    walk(parts(option)[0], inherited(option), "")
    return found


def test_no_option_restates_a_default():
    options = sorted(p for p in CONF.rglob("*.yaml") if "hydra" not in p.parts)
    assert len(options) > 100
    found = [f"{option.relative_to(CONF)}: {k}" for option in options for k in restated(option)]
    assert not found, f"{len(found)} values restate the schema's or a parent option's default: {found}"


def test_a_restated_default_is_found(tmp_path):
    (tmp_path / "base.yaml").write_text("defaults:\n  - /schema/selection/sleb@_here_\n  - _self_\nmetric: sleb\n")
    (tmp_path / "child.yaml").write_text("defaults:\n  - base\n  - _self_\nearly_barrier: 1\nlatter_barrier: 2\n")
    assert restated(tmp_path / "base.yaml") == []
    assert restated(tmp_path / "child.yaml") == ["early_barrier"]
