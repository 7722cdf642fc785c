"""The schema in Hydra's ConfigStore, so that composition refuses a key no option of its group has.

Every shape of :mod:`replaceme_exp.config.schema` is stored as ``schema/<group>/<shape>``; each YAML
option names its shape first in its defaults list (``- /schema/calibration/text@_here_``), and
``conf/config.yaml`` starts from ``schema/job``. The stored nodes hold the schema's keys and
defaults; their values are typed ``Any`` so that a bad *value* (``alpha=abc``) still composes and is
refused by :func:`~replaceme_exp.config.validate.typed_config` in one line, as a failed row that does
not stop a sweep, while a misspelled *key* fails composition at once.
"""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import re
import typing
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from replaceme_exp.config import schema
from replaceme_exp.config.validate import hints
from replaceme_exp.registry import registry

# Groups whose options come in several shapes: a field of one of these types holds any of them.
POLYMORPHIC = (
    schema.ModelConfig,
    schema.CalibrationConfig,
    schema.SelectionConfig,
    schema.ObjectiveConfig,
    schema.HealingConfig,
    schema.HealingDataConfig,
    schema.EvalConfig,
)


# The twins below are made at run time, so a launcher that hands the ConfigStore to another process
# (joblib's loky workers, submitit) pickles them by value, and with them each field's
# ``dataclasses.MISSING``. Unpickled as a copy, that sentinel is no longer ``MISSING``: OmegaConf then
# reads it as a default value and refuses every field that has a default_factory. Pickled as the name
# ``dataclasses.MISSING``, it is the same object in every process.
copyreg.pickle(type(dataclasses.MISSING), lambda _: "MISSING")


def shape_name(group: str, cls: type) -> str:
    """The name a YAML option of ``group`` uses for its shape: ``TextCalibrationConfig`` ->
    ``text``, ``DatasetHealingDataConfig`` (``healing.data``) -> ``dataset``; a group's base -> ``base``."""
    word = "".join(part.capitalize() for part in group.split("."))
    name = re.sub(r"Config$", "", cls.__name__).replace(word, "")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or "base"


def _inner(annotation) -> tuple[bool, Any]:
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return True, rest[0] if len(rest) == 1 else Any
    return False, annotation


@functools.cache
def twin(cls: type) -> type:
    """``cls`` with its keys and defaults, every value typed ``Any`` (nested structures kept, so
    their keys are checked too; a polymorphic group left open). Twins inherit as their classes do,
    so an option may extend another of a narrower shape (``eval=clip`` extends ``eval=heldout``)."""
    bases = tuple(twin(b) for b in cls.__bases__ if dataclasses.is_dataclass(b))
    inherited = {f.name for b in cls.__bases__ if dataclasses.is_dataclass(b) for f in dataclasses.fields(b)}
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in inherited:
            continue
        optional, inner = _inner(hints(cls)[f.name])
        if dataclasses.is_dataclass(inner) and not issubclass(inner, POLYMORPHIC):
            annotation = Optional[twin(inner)] if optional else twin(inner)
        else:
            annotation = Any
        if f.default is not dataclasses.MISSING:
            default = f.default
            spec = dataclasses.field(default=default)
        elif dataclasses.is_dataclass(inner) and not issubclass(inner, POLYMORPHIC):
            spec = dataclasses.field(default_factory=twin(inner))  # a nested group: its own defaults
        elif f.default_factory is not dataclasses.MISSING:
            spec = dataclasses.field(default_factory=f.default_factory)
        else:
            spec = dataclasses.field(default=MISSING)
        fields.append((f.name, annotation, spec))
    return dataclasses.make_dataclass(f"{cls.__name__}Keys", fields, bases=bases)


def group_shapes() -> dict[str, tuple[type, ...]]:
    """Every group's shapes: the schema's own, and those of the registered calibration sources."""
    out = dict(schema.GROUP_SHAPES)
    for group, (_, key) in schema.SHAPE_REGISTRIES.items():
        shapes: list[type] = []
        for _, entry in registry(key).items():
            shapes += [s for s in entry.shapes if s not in shapes]
        out[group] = tuple(shapes)
    return out


def register_schemas() -> None:
    """Store ``schema/job`` and every ``schema/<group>/<shape>`` (idempotent; the stage packages
    that register calibration sources must be imported first)."""
    store = ConfigStore.instance()
    store.store(group="schema", name="job", node=twin(schema.JobConfig))
    for group, shapes in group_shapes().items():
        for cls in shapes:
            store.store(group=f"schema/{group.replace('.', '/')}", name=shape_name(group, cls), node=twin(cls))
