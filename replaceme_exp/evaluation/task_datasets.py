"""The datasets an lm-eval suite reads, found before the model loads (so that an offline job says
which task's data is missing before it prunes, not after).

lm-eval's task index (every YAML under ``lm_eval/tasks``, about 14,000) costs some 10 s to build.
A suite names a few tasks, so only the YAML files that mention one of its names (or include a file
that does: a template that tags its tasks) are parsed, with lm-eval's own YAML loader and indexing
rules (``lm_eval.tasks._index``, ``_yaml_loader``), as often as groups and tags name further tasks.
A name found that way nowhere (or an lm-eval without those modules) is looked up in lm-eval's full
index once; a name that index does not know either is refused.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replaceme_exp.config.schema import HarnessConfig
from replaceme_exp.data.hub import HubDataset
from replaceme_exp.errors import ConfigError
from replaceme_exp.evaluation.harness import HUB_TASKS, lm_eval_version

log = logging.getLogger(__name__)

# What to evaluate on instead of a suite whose data cannot be read here.
OFFLINE_SUITES = (
    "evaluate offline (eval=offline: the project's own tasks, eval=quick: their first items, "
    "or eval=heldout: held-out perplexity only)"
)
_INCLUDE = re.compile(r"""^\s*["']?include["']?\s*:\s*["']?([^"'\s#]+)""", re.MULTILINE)


def task_roots(cfg: HarnessConfig) -> tuple[Path, ...]:
    """Where the suite's tasks are defined, in lm-eval's order (later roots override earlier)."""
    import lm_eval.tasks

    return (Path(lm_eval.tasks.__file__).parent, HUB_TASKS)


@dataclass(frozen=True)
class TaskFiles:
    """The task YAMLs under a root as lm-eval walks them (sorted): their text, and for each file
    the files that include it (``include:``)."""

    texts: dict[Path, str]
    included_by: dict[Path, tuple[Path, ...]]


@functools.lru_cache(maxsize=4)
def task_files(root: Path) -> TaskFiles:
    texts: dict[Path, str] = {}
    included_by: dict[Path, list[Path]] = {}
    for path in sorted(root.glob("**/*.yaml"), key=lambda p: p.as_posix()):
        if any(part in ("__pycache__", ".ipynb_checkpoints") for part in path.parts):
            continue
        try:
            texts[path] = text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for name in _INCLUDE.findall(text):
            included_by.setdefault(Path(os.path.normpath(path.parent / name)), []).append(path)
    return TaskFiles(texts, {k: tuple(v) for k, v in included_by.items()})


def _partial_index(names: set[str], roots: tuple[Path, ...]) -> dict[str, Any]:
    """lm-eval's index entries (``lm_eval.tasks._index.Entry``) of the YAML files that mention one
    of ``names`` or include such a file."""
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    pattern = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(n) for n in sorted(names)) + r")(?![\w-])")
    index: dict[str, Any] = {}
    for root in roots:
        files = task_files(root)
        chosen = [path for path, text in files.texts.items() if pattern.search(text)]
        seen = set(chosen)
        while chosen:  # a file that includes a chosen one (whose template tags its task) is chosen too
            more = [p for path in chosen for p in files.included_by.get(path, ()) if p not in seen]
            seen.update(more)
            chosen = more
        found: dict[str, Any] = {}
        for path in files.texts:
            if path in seen:
                try:
                    TaskIndex.process_cfg(load_yaml(path, resolve_func=False, recursive=True), path, found)
                except Exception as err:  # noqa: BLE001 - lm-eval skips a YAML it cannot read, so do we
                    log.debug("skipped %s (%s)", path, err)
        index.update(found)
    return index


@functools.lru_cache(maxsize=1)
def _full_index(roots: tuple[Path, ...]) -> dict[str, Any]:
    from lm_eval.tasks import TaskManager

    log.info("looking the suite's tasks up in lm-eval's full task index")
    return TaskManager(include_path=str(roots[-1]), include_defaults=True).task_index


def _leaves(name: str, index: dict[str, Any], unknown: set[str], seen: set[str]) -> list[dict]:
    """The task configurations ``name`` (a task, group or tag) runs; names not in ``index`` go to
    ``unknown``."""
    if name in seen:
        return []
    seen.add(name)
    entry = index.get(name)
    if entry is None:
        unknown.add(name)
        return []
    kind = getattr(entry.kind, "name", "")
    if kind == "TAG":
        return [cfg for task in sorted(entry.tags) for cfg in _leaves(task, index, unknown, seen)]
    if kind == "GROUP":
        members = (entry.cfg or {}).get("task") or []
        out = []
        for member in members if isinstance(members, list) else [members]:
            if isinstance(member, str):
                out += _leaves(member, index, unknown, seen)
            elif isinstance(member, dict) and "dataset_path" in member:
                out.append(member)
            elif isinstance(member, dict) and isinstance(member.get("task"), str):  # a task with overrides
                out += [{**cfg, **member} for cfg in _leaves(member["task"], index, unknown, set(seen))]
        return out
    return [entry.cfg or {}]


def _data_files(kwargs: Any) -> tuple[str, ...]:
    files = (kwargs or {}).get("data_files") if isinstance(kwargs, dict) else None
    if isinstance(files, dict):
        files = [f for value in files.values() for f in (value if isinstance(value, list) else [value])]
    return tuple(str(f) for f in (files if isinstance(files, list) else [files] if files else []))


def suite_datasets(cfg: HarnessConfig) -> list[HubDataset]:
    """The datasets the lm-eval suite ``cfg`` (``eval.harness``) reads, one per distinct dataset,
    each named by the suite's task that reads it (None for the project's own offline tasks, whose
    data ship with it). A task that is no lm-eval task, group or tag is refused."""
    if cfg.local_tasks:
        return []
    roots = task_roots(cfg)
    names = set(cfg.tasks)
    unknown: set[str] = set()
    for _ in range(8):  # groups name groups: widen the partial index until every name is found
        try:
            index = _partial_index(names, roots)
        except ImportError:  # an lm-eval release without these modules: its full index below
            unknown = set(cfg.tasks)
            break
        unknown = set()
        leaves = {task: _leaves(task, index, unknown, set()) for task in cfg.tasks}
        if not unknown or unknown <= names:
            break
        names |= unknown
    if unknown:
        index = _full_index(roots)
        unknown = set()
        leaves = {task: _leaves(task, index, unknown, set()) for task in cfg.tasks}
    for task in cfg.tasks:
        if task in unknown:
            reason = f"is not an lm-eval task, group or tag (lm-eval {lm_eval_version()}, or {HUB_TASKS.name}/)"
            raise ConfigError("eval.harness.tasks", task, reason)
    out = []
    for task, configs in leaves.items():
        for config in configs:
            path = config.get("dataset_path")
            if not isinstance(path, str) or config.get("custom_dataset"):
                continue  # data a Python function makes: nothing to look up
            kwargs = config.get("dataset_kwargs")
            out.append(
                HubDataset(
                    "eval.harness.tasks",
                    task,
                    path,
                    config.get("dataset_name"),
                    data_files=_data_files(kwargs),
                    instead=OFFLINE_SUITES,
                )
            )
    return out
