"""Hydra's composition errors in one line: a misspelled key in a YAML file or on the command line,
an unknown option, a bad override. They name the key, where it was and what would work, then the
process stops with exit code 2 (a bad value composes, and is refused as a failed row instead)."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from replaceme_exp import multirun_templates
from replaceme_exp.config import schema
from replaceme_exp.errors import first_line

log = logging.getLogger("replaceme_exp")


def _chain(err: BaseException) -> str:
    texts, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        texts.append(str(err))
        err = err.__cause__ or err.__context__
    return "\n".join(texts)


def _keys_of(shape: str) -> str:
    cls = getattr(schema, shape.removesuffix("Keys"), None)
    return ", ".join(sorted(f.name for f in dataclasses.fields(cls))) if dataclasses.is_dataclass(cls) else ""


def _chosen(group: str, overrides: list[str]) -> str:
    """The option the command line chose for ``group`` (``calibration=bundled_images``), "" when none."""
    for override in reversed(overrides):
        name, _, value = override.lstrip("+~").partition("=")
        if name == group and value:
            return f"{group}={value}"
    return ""


def one_line(err: BaseException, overrides: list[str] | None = None) -> str:
    """The error as one line: ``calibration.n_sampels: not a key of calibration/mine.yaml (its keys: ...)``.

    A key that a file of another group sets (``experiment/sleb.yaml`` setting ``calibration.seq_len``
    on an image calibration) names both the file and the option it does not compose with."""
    text = _chain(err)
    unknown = re.search(r"Key '([^']+)' not in '([^']+)'", text)
    if unknown:
        full = re.search(r"full_key: (\S+)", text)
        where = re.search(r"In '([^']+)'", text)
        key = full.group(1) if full else unknown.group(1)
        keys = _keys_of(unknown.group(2))
        its_keys = f" (its keys: {keys})" if keys else ""
        group = key.split(".", 1)[0]
        if where and "." in key and where.group(1).split("/", 1)[0] not in (group, "config"):
            chosen = _chosen(group, overrides or [])
            target = f"{chosen}, which has no such key" if chosen else f"the {group} chosen, which has no such key"
            return f"{key}: set by {where.group(1)}.yaml for {target}{its_keys}: they do not compose"
        place = f" of {where.group(1)}.yaml" if where and where.group(1) != "config" else ""
        return f"{key}: not a key{place}{its_keys}"
    missing = re.search(r"Could not find '([^']+)'\s*Available options in '([^']+)':\n((?:\t.*\n?)*)", text)
    if missing:
        options = ", ".join(line.strip() for line in missing.group(3).splitlines() if line.strip())
        group, option = missing.group(1).rsplit("/", 1)
        return f"{group}={option}: no such option (choose one of {options})"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return "; ".join(lines) or type(err).__name__


def raised_while_composing(err: BaseException) -> bool:
    """Whether ``err`` came out of Hydra or OmegaConf applying the overrides (an override OmegaConf
    cannot merge, e.g. a key under a group set to null, fails with a plain AssertionError or
    AttributeError there), not out of the job."""
    frames = list(traceback.walk_tb(err.__traceback__))
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    here = os.path.abspath(__file__)
    in_job = any(f.f_code.co_filename.startswith(ours) and f.f_code.co_filename != here for f, _ in frames)
    inner = frames[-1][0].f_code.co_filename if frames else ""
    return not in_job and any(f"{os.sep}{lib}{os.sep}" in inner for lib in ("hydra", "omegaconf"))


def template_names(group: str) -> list[str]:
    """The templates of ``group`` (``paper``, ``methods``, ``study``) in ``replaceme_exp/multirun_templates``."""
    folder = Path(multirun_templates.__file__).parent / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


def check_template_overrides(overrides: list[str]) -> str | None:
    """The one line that refuses a template override naming anything but one of its group's
    templates (``+paper=../../conf/config`` would compose a file outside ``multirun_templates/``);
    None when every one is a template."""
    folder = Path(multirun_templates.__file__).parent
    groups = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name[0] != "_")
    for override in overrides:
        name, equals, value = override.partition("=")
        group = name.lstrip("+~")
        if not equals or group not in groups or not value or "(" in value:  # choice(...), glob(...): Hydra's
            continue
        names = template_names(group)
        for each in value.split(","):
            if each not in names:
                where = "leaves" if any(part in each for part in ("/", "\\", "..")) else "is not a template of"
                return (
                    f"{name}={each}: {where} multirun_templates/{group}"
                    f" (choose one of {', '.join(names)})"
                )
    return None


@contextmanager
def one_line_composition_errors() -> Iterator[None]:
    """Around ``hydra.main``: a composition error becomes one logged line and exit code 2
    (``HYDRA_FULL_ERROR=1`` keeps Hydra's own report with its traceback)."""
    if (refused := check_template_overrides(sys.argv[1:])) is not None:
        logging.basicConfig(format="%(message)s")
        log.error("invalid configuration: %s", refused)
        sys.exit(2)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing a multi-line report
    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:
        logging.basicConfig(format="%(message)s")
        log.error("invalid configuration: %s", one_line(err, sys.argv[1:]))
        sys.exit(2)
    except Exception as err:
        if not raised_while_composing(err):
            raise
        logging.basicConfig(format="%(message)s")
        nested = [o for o in sys.argv[1:] if "=" in o and "." in o.split("=", 1)[0] and not o.startswith("hydra")]
        hint = f": check {' '.join(nested)} (OmegaConf cannot set a key under a node that is null)" if nested else ""
        what = f"{type(err).__name__}: {first_line(err)}"
        log.error("invalid configuration: the overrides cannot be applied (%s)%s", what, hint)
        sys.exit(2)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)
