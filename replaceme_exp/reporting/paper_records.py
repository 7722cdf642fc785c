"""The paper's tables and figures as data: ``paper.yaml`` read into plain Python values.

The file's format is described at its top. This module resolves what the YAML cannot say by itself:
the ``!any`` and ``!fraction_of_depth`` tags (:data:`cells.ANY`, :class:`cells.FractionOfDepth`) and
the ``use:`` / ``without:`` keys of a conditions mapping, so that every conditions mapping it returns
is a plain ``{column: value}`` dict in the order a Python ``{**a, "k": v}`` would give.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from replaceme_exp.reporting.cells import ANY, FractionOfDepth

PAPER_RECORDS = Path(__file__).with_name("paper.yaml")
SECTIONS = ("settings", "columns", "anchors", "tables", "figures")


class _RecordsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the file's two tags."""


_RecordsLoader.add_constructor("!any", lambda loader, node: ANY)
_RecordsLoader.add_constructor(
    "!fraction_of_depth", lambda loader, node: FractionOfDepth(float(loader.construct_scalar(node)))
)


@cache
def paper_records(path: Path = PAPER_RECORDS) -> dict:
    """The file's sections, as loaded: ``settings`` (name -> conditions, resolved), ``columns`` (name ->
    list of column entries), ``tables`` (list of table mappings), ``figures`` (name -> list of series
    mappings). Table and series conditions are left as written; resolve them with :func:`conditions`."""
    records = yaml.load(Path(path).read_text(), Loader=_RecordsLoader) or {}
    unknown = sorted(set(records) - set(SECTIONS))
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {unknown}; the sections are {list(SECTIONS)}")
    settings: dict[str, dict] = {}
    for name, written in (records.get("settings") or {}).items():
        settings[name] = _resolve(written, settings, f"settings.{name}")
    return {**records, "settings": settings}


def conditions(written, where: str, path: Path = PAPER_RECORDS) -> dict:
    """A conditions mapping as written (a mapping, or a list of mappings merged in order; None: none)
    with its ``use:`` and ``without:`` keys resolved against the file's settings."""
    return _resolve(written, paper_records(path)["settings"], where)


def setting(name: str, path: Path = PAPER_RECORDS) -> dict:
    """The named condition set of the file's ``settings`` (a fresh dict)."""
    settings = paper_records(path)["settings"]
    if name not in settings:
        raise KeyError(f"{path}: no setting {name!r}; the settings are {sorted(settings)}")
    return dict(settings[name])


def check_keys(entry: dict, allowed: tuple[str, ...], where: str) -> None:
    """Refuse, in one line naming them, the keys of a record's ``entry`` it does not know (a misspelt
    ``conditions`` would otherwise leave a row matching every run)."""
    unknown = sorted(set(entry) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; the keys are {list(allowed)}")


def _resolve(written, settings: dict[str, dict], where: str) -> dict:
    parts = written if isinstance(written, list) else [written or {}]
    out: dict = {}
    for part in parts:
        if not isinstance(part, dict):
            raise ValueError(f"{where}: conditions must be a mapping or a list of mappings, got {part!r}")
        for key, value in part.items():
            if key == "use":
                for name in [value] if isinstance(value, str) else value:
                    if name not in settings:
                        raise ValueError(f"{where}: use={name!r} names no earlier setting; known: {sorted(settings)}")
                    out.update(settings[name])
            elif key == "without":
                for dropped in [value] if isinstance(value, str) else value:
                    out.pop(dropped, None)
            else:
                out[key] = value
    return out
