"""The configuration reference (``docs/configuration.md``), generated from the schema and the shipped
options, so it cannot drift from what a job accepts:

    python -m replaceme_exp.reporting.config_reference > docs/configuration.md     (make docs-reference)

``tests/unit/config/test_config_reference.py`` fails when the file differs from what this prints.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

import replaceme_exp.pipeline  # noqa: F401  (every registry, and the ConfigStore schemas)
from replaceme_exp.config import schema
from replaceme_exp.config.store import group_shapes, shape_name
from replaceme_exp.config.validate import hints
from replaceme_exp.registry import registry

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUP_ORDER = ("model", "calibration", "selection", "objective", "estimation", "regularizer", "structure",
               "healing", "healing.data", "eval", "capture", "store", "tracking", "progress")  # fmt: skip


def type_text(annotation, f: dataclasses.Field) -> str:
    """A field's type as a reader wants it: ``int``, ``fused | separate``, ``float or null``."""
    if f.metadata.get("choices"):
        try:
            return " \\| ".join(f"`{n}`" for n in registry(f.metadata["choices"]).names())
        except LookupError:
            return "str"
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return f"{type_text(rest[0], f) if len(rest) == 1 else 'any'} or null"
    if args and typing.get_origin(annotation) is not Literal and all(isinstance(a, type) for a in args):
        if typing.get_origin(annotation) not in (list, dict):
            return " or ".join(a.__name__ for a in args)
    if typing.get_origin(annotation) is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if dataclasses.is_dataclass(annotation):
        return "mapping"
    if annotation is Any:
        return "any"
    origin = typing.get_origin(annotation)
    if origin is list:
        return "list"
    if origin is dict:
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(mapping)"
    else:
        return "(the option's)"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def key_rows(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    rows = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        annotation = hints(cls)[f.name]
        inner = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        if dataclasses.is_dataclass(inner[0]) and f"{prefix}{f.name}" not in GROUP_ORDER:
            rows += key_rows(inner[0], f"{prefix}{f.name}.")
            continue
        doc = f.metadata.get("doc", "")
        rows.append(f"| `{prefix}{f.name}` | {type_text(annotation, f)} | {default_text(f)} | {doc} |")
    return rows


def options(group: str) -> list[tuple[str, str]]:
    """The shipped options of a group: (name, the first sentence of their opening comment)."""
    folder = CONF / group.replace(".", "/")
    out = []
    for path in sorted(folder.glob("*.yaml")):
        comment = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            text = line[1:].strip()
            if text.startswith("@package"):  # an option that also sets top-level keys (gemma3_270m)
                continue
            if text.startswith("python run.py") or not text:
                break
            comment.append(text)
        sentence = " ".join(comment).split(". ")[0].rstrip(".")
        out.append((path.stem, sentence))
    return out


def render() -> str:
    shapes = group_shapes()
    out = [
        "# Configuration reference",
        "",
        "Generated from `replaceme_exp/config/schema.py` and `conf/` by `make docs-reference`; do not edit.",
        "A key that no shape of its group has fails composition in one line; a bad value is refused in one",
        "line before any model loads. Defaults marked *(the option's)* are set by each option's YAML.",
        "",
        "## Top-level keys",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
        *key_rows(schema.JobConfig, "", skip=GROUP_ORDER),
        "",
        "## `protocol`",
        "",
        "A config group of top-level settings (`conf/protocol/`): its fixed values compose like any other",
        "option's; the settings it leaves to rules (`null`, or `auto` for `model.capture_dtype`) are settled",
        "before the job starts (`replaceme_exp/config/protocol.py`). A value given anywhere wins.",
        "",
        "| option | what it is |",
        "|---|---|",
        *[f"| `{name}` | {text} |" for name, text in options("protocol")],
    ]
    for group in GROUP_ORDER:
        out += ["", f"## `{group}`", ""]
        if group != "progress":
            listed = options(group)
            if listed:
                rows = [f"| `{name}` | {text} |" for name, text in listed]
                out += ["| option | what it is |", "|---|---|", *rows, ""]
        for cls in shapes.get(group, (schema.ProgressConfig,)):
            title = shape_name(group, cls)
            several = len(shapes.get(group, ())) > 1
            out += [f"### `{group}` shape `{title}`" if several else f"### Keys of `{group}`", ""]
            if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
                out += [" ".join(cls.__doc__.split()), ""]
            out += ["| key | type | default | meaning |", "|---|---|---|---|", *key_rows(cls, f"{group}.")]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
