"""A composed configuration checked against the schema and turned into typed dataclasses.

:func:`typed_config` walks :class:`~replaceme_exp.config.schema.JobConfig`: each group becomes the
shape whose keys it has, each value is checked by its field's ``check`` (or by its annotation when
it has none) and by the registry its field names (``choices``), and the first bad value raises one
:class:`~replaceme_exp.errors.ConfigError` naming key, value and reason. Cheap: no model, no data.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

from replaceme_exp.config import schema
from replaceme_exp.config.protocol import settle
from replaceme_exp.errors import ConfigError, first_line
from replaceme_exp.registry import registry

_ABSENT = object()


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def fields_of(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _optional(annotation) -> tuple[bool, Any]:
    """(whether None is allowed, the annotation without None)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        allowed = len(args) < len(typing.get_args(annotation))
        return allowed, args[0] if len(args) == 1 else Union[tuple(args)]
    return False, annotation


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


INT64 = (-(2**63), 2**63 - 1)


def out_of_range(value) -> str | None:
    """Why an integer in ``value`` (or in a list of them, nested) is out of range: the row, torch
    and the seeds take 64-bit integers."""
    if isinstance(value, list):
        return next(filter(None, map(out_of_range, value)), None)
    if _is_int(value) and not INT64[0] <= value <= INT64[1]:
        return "is beyond the 64-bit integer range"
    return None


def annotation_reason(annotation, value) -> str | None:
    """Why ``value`` does not fit ``annotation`` (None when it does); for fields without a check."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return None
    if origin is Literal:
        options = typing.get_args(annotation)
        return None if value in options else f"choose one of {', '.join(map(str, options))}"
    if annotation is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if annotation is int:
        return None if _is_int(value) else "must be an integer"
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "must be a finite number"
    if annotation is str:
        return None if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "must be a string"
    if origin is list:
        return None if isinstance(value, list) else "must be a list"
    if origin is dict:
        return None if isinstance(value, dict) else "must be a mapping"
    return None


def shape_of(group: str, data: dict, path: str | None = None) -> type:
    """The schema class of an option of ``group`` (found at ``path``, default the group): the shape
    whose keys are the option's keys (a key no shape has is refused, naming the closest shape's keys)."""
    path = path or group
    if group in schema.SHAPE_REGISTRIES:
        field_name, registry_key = schema.SHAPE_REGISTRIES[group]
        if field_name not in data:
            raise ConfigError(f"{path}.{field_name}", None, "is missing")
        shapes = registry(registry_key).get(data[field_name]).shapes
    else:
        shapes = schema.GROUP_SHAPES[group]
    keys = set(data)
    exact = [cls for cls in shapes if set(fields_of(cls)) == keys]
    if exact:
        return exact[-1]
    covering = [cls for cls in shapes if keys <= set(fields_of(cls))]
    if covering:
        return min(covering, key=lambda cls: len(fields_of(cls)))
    closest = min(shapes, key=lambda cls: (len(keys - set(fields_of(cls))), len(fields_of(cls))))
    unknown = sorted(keys - set(fields_of(closest)))[0]
    known = ", ".join(sorted(fields_of(closest)))
    raise ConfigError(f"{path}.{unknown}", data[unknown], f"is not a key of {path} (its keys: {known})")


def build(cls: type, data: Any, path: str = "") -> Any:
    """``data`` (plain containers) checked against ``cls`` and returned as a ``cls`` instance."""
    where = path or "config"
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    if path in schema.GROUP_SHAPES or path in schema.SHAPE_REGISTRIES:
        cls = shape_of(path, data)
    fields = fields_of(cls)
    if unknown := sorted(set(data) - set(fields)):
        name = unknown[0]
        full = f"{path}.{name}" if path else name
        raise ConfigError(full, data[name], f"is not a key of {where} (its keys: {', '.join(sorted(fields))})")
    values = {}
    for name, f in fields.items():
        full = f"{path}.{name}" if path else name
        value = data.get(name, _ABSENT)
        if value is _ABSENT or value == "???":
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if has_default and value is _ABSENT:
                continue
            if value == "???":  # the option leaves it to the user
                raise ConfigError(full, value, f"is missing: give it, e.g. {full}=<value>")
            raise ConfigError(full, None, "is missing")
        values[name] = check_value(hints(cls)[name], f, value, full)
    return cls(**values)


def build_option(group: str, data: dict, path: str) -> Any:
    """``data``, an option of ``group`` held elsewhere (e.g. ``eval.heldout_images``, an image set),
    checked and returned as its shape."""
    if not isinstance(data, dict):
        raise ConfigError(path, data, "must be a mapping")
    return build(shape_of(group, data, path), data, path)


def check_value(annotation, f: dataclasses.Field, value, full: str):
    nullable, inner = _optional(annotation)
    if value is None:
        if nullable:
            return None
        raise ConfigError(full, None, "is missing")
    if dataclasses.is_dataclass(inner):
        return build(inner, value, full)
    check = f.metadata.get("check")
    reason = out_of_range(value) or (check(value) if check else annotation_reason(inner, value))
    if reason:
        raise ConfigError(full, value, reason)
    if choices := f.metadata.get("choices"):
        names = registry(choices)
        for one in value if isinstance(value, list) else [value]:
            names.get(one)
    return value


def unresolvable(node: DictConfig | ListConfig, prefix: str = "") -> tuple[str, str, Exception] | None:
    """The first key whose interpolation cannot be resolved: (key, the interpolation as written,
    the error), or None."""
    keys = [k for k in node.keys() if k != "hydra"] if isinstance(node, DictConfig) else range(len(node))
    for k in keys:
        path = f"{prefix}.{k}" if prefix and isinstance(k, str) else f"{prefix}[{k}]" if prefix else str(k)
        try:
            value = node[k]
        except Exception as err:  # noqa: BLE001 - OmegaConf raises several types while resolving
            written = OmegaConf.to_container(node, resolve=False)[k]
            return path, written, err
        if isinstance(value, (DictConfig, ListConfig)) and (found := unresolvable(value, path)):
            return found
    return None


def resolved_container(cfg: DictConfig | dict) -> dict:
    """The configuration as plain containers, interpolations resolved (one line naming the key if
    one cannot be)."""
    if isinstance(cfg, dict):
        return cfg
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # noqa: BLE001 - an interpolation that cannot resolve
        key, written, cause = unresolvable(cfg) or ("config", "<interpolation>", err)
        raise ConfigError(key, written, f"cannot be resolved: {first_line(cause)}") from err


def typed_config(cfg: DictConfig | dict) -> schema.JobConfig:
    """``cfg`` checked key by key and returned as a :class:`~replaceme_exp.config.schema.JobConfig`,
    every setting left to the protocol settled (:func:`~replaceme_exp.config.protocol.settle`)."""
    data = {k: v for k, v in resolved_container(cfg).items() if k != "hydra"}
    return settle(build(schema.JobConfig, data))
