"""Which runs a table cell or a figure point averages: only runs identical except for the seed.

The runs that match a cell's conditions may still differ in settings the conditions do not name
(a numerical solver, the dtype, the eval batch size, ...). :func:`choose_setting` splits them into
*settings*: rows with the same ``setting_hash`` (a hash of the job's effective settings without
the seed), or, for rows written before that column existed, the same values of the
:data:`SETTING_COLUMNS` present in the frame. One setting is shown; the others are reported.

The shown setting is chosen deterministically by, in order:

1. the most preferred values met (``prefer``: e.g. ``solver=adam``, ``dtype=bfloat16``; see
   :data:`PREFERRED_SETTINGS`; a setting meets ``key=value`` when all its runs match it);
2. the most runs;
3. the latest run (the largest ``started_at``);
4. the smallest setting key (only so that the choice never depends on row order).

Shared by ``paper_tables`` and ``paper_figures``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaceme_exp.config.depth import blocks_to_prune
from replaceme_exp.errors import ConfigError

# A row written before a key existed matches that key's default value (e.g. healing=none).
DEFAULTS_FOR_MISSING_COLUMNS = {"healing": "none", "estimation_tokens": "all", "protocol": "paper"}

# The columns that define a setting, for rows without ``setting_hash`` (the signature uses those
# present in the frame). Not the seed, run ids, timestamps, code versions, devices or metrics, and
# not the cuts (selected cuts are a result that may move with the calibration sample).
SETTING_COLUMNS = (
    "model",
    "model_fingerprint",
    "dtype",
    "eval",
    "calibration",
    "n_calib_samples",
    "calib_seq_len",
    "calibration_order",
    "calibration_chat_turns",
    "calibration_batch_order",
    "calibration_drop_last",
    "calibration_empty_records",
    "calibration_mix_order",
    "calibration_sha256",
    "protocol",
    "capture_4bit",
    "capture_dtype",
    "padded_positions",
    "objective",
    "solver",
    "solver_schedule",
    "alpha_scale",
    "structure",
    "regularizer",
    "alpha",
    "mask_ratio",
    "mask_passes",
    "estimation_tokens",
    "estimation_first",
    "massive_threshold",
    "lt_placement",
    "healing",
    "multi_lt",
    "num_lts",
    "n_prune",
    "merge_consecutive",
    "touching_cuts",
    "selection_metric",
    "healing_data_sha256",
    "eval_text",
    "eval_text_sha256",
    "eval_seq_len",
    "eval_max_windows",
    "eval_batch_size",
    "eval_max_length",
    "eval_add_bos_token",
    "eval_fewshot",
    "eval_fewshot_seed",
    "eval_limit",
    "eval_metrics",
    "lm_eval_version",
    "torch_version",
    "transformers_version",
    "model_revision",
)

# The paper's runs, where a table or row declares nothing else: bfloat16 weights, and the
# numerical objectives trained with mini-batch Adam, other solvers with the official code's
# one-step-per-batch schedule, fitted on every calibration token. A preference that no candidate
# setting records (a closed form has solver=None; an absent column) does not discriminate.
PREFERRED_SETTINGS = {"dtype": "bfloat16", "solver": "adam", "solver_schedule": "minibatch", "estimation_tokens": "all"}


@dataclass(frozen=True)
class FractionOfDepth:
    """A condition on ``n_prune`` that holds for any model: the run removed as many blocks as
    ``n_prune=<fraction>`` removes of its ``num_layers`` (the job's rounding,
    :func:`~replaceme_exp.config.depth.blocks_to_prune`: 25% is 8 of 30 or 32 blocks, 2 of 6).
    A finished row records the blocks it removed in ``n_prune``."""

    fraction: float

    def mask(self, table: pd.DataFrame) -> pd.Series:
        if not {"n_prune", "num_layers"} <= set(table.columns):
            return pd.Series(False, index=table.index)

        def wanted(depth) -> float:
            try:
                return float(blocks_to_prune(float(self.fraction), int(depth)))
            except (ConfigError, TypeError, ValueError):  # no depth, or under one block of it
                return np.nan

        depths = pd.to_numeric(table["num_layers"], errors="coerce")
        blocks = pd.to_numeric(table["n_prune"], errors="coerce")
        return blocks == depths.map(wanted)

    def asked(self, table: pd.DataFrame) -> pd.Series:
        """The runs that asked for this fraction (``n_prune_asked``: the fraction itself, or the
        blocks it removes of their ``num_layers``), whatever they removed; none for rows written
        before the column existed."""
        if "n_prune_asked" not in table.columns:
            return pd.Series(False, index=table.index)
        given = pd.to_numeric(table["n_prune_asked"], errors="coerce")
        as_fraction = (given - float(self.fraction)).abs() < 1e-12
        wanted = self.mask(table.assign(n_prune=given))
        return as_fraction | wanted

    def __str__(self) -> str:
        return f"{100 * self.fraction:g}% of num_layers"


class _Any:
    """A condition's value that lifts a condition merged from elsewhere (a row's over its table's)."""

    def __repr__(self) -> str:
        return "any"

    __str__ = __repr__


ANY = _Any()


def matches(table: pd.DataFrame, conditions: dict) -> pd.Series:
    """Boolean mask of the runs whose columns equal ``conditions``: numbers within 1e-12, None
    for a missing value, a :class:`FractionOfDepth` by its own rule, :data:`ANY` for every value,
    and a column absent from every run matches its default (if it has one)."""
    mask = pd.Series(True, index=table.index)
    for key, value in conditions.items():
        if value is ANY:
            continue
        if isinstance(value, FractionOfDepth):
            mask &= value.mask(table)
            continue
        if key not in table.columns:
            if DEFAULTS_FOR_MISSING_COLUMNS.get(key, object()) == value:
                continue
            return pd.Series(False, index=table.index)
        column = table[key]
        if key in DEFAULTS_FOR_MISSING_COLUMNS:
            column = column.fillna(DEFAULTS_FOR_MISSING_COLUMNS[key])
        if value is None:
            mask &= column.isna()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            mask &= pd.to_numeric(column, errors="coerce").sub(value).abs() < 1e-12
        else:
            mask &= column == value
    return mask


def _missing(value) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value)) if np.ndim(value) == 0 else False
    except (TypeError, ValueError):
        return False


def _plain(value):
    """A JSON-able, order-stable form of one cell (numbers as numbers, 8 == 8.0)."""
    if _missing(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
        return int(number) if number.is_integer() else number
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    return str(value)


def setting_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in SETTING_COLUMNS if c in frame.columns]


# Recorded with each run and part of its setting key beside the setting hash: runs made with other
# library versions or another resolved model revision are not averaged with it.
VERSION_COLUMNS = ("torch_version", "transformers_version", "lm_eval_version", "eval_task_versions", "model_revision")


def setting_keys(frame: pd.DataFrame) -> pd.Series:
    """Per run, the key of its setting: ``hash:<setting_hash>`` (with its recorded versions,
    :data:`VERSION_COLUMNS`), or for a run without one ``sig:<digest>`` of its values in
    :data:`SETTING_COLUMNS`."""
    columns = setting_columns(frame)
    hashes = frame["setting_hash"] if "setting_hash" in frame.columns else pd.Series(None, index=frame.index)

    versions = [c for c in VERSION_COLUMNS if c in frame.columns]

    def key(index) -> str:
        value = hashes.loc[index]
        if not _missing(value):
            # The config alone does not pin the code that ran: library versions and the resolved model.
            pinned = json.dumps({c: _plain(frame.at[index, c]) for c in versions}, sort_keys=True)
            return f"hash:{value}:" + hashlib.sha256(pinned.encode()).hexdigest()[:8]
        signature = json.dumps({c: _plain(frame.at[index, c]) for c in columns}, sort_keys=True)
        return "sig:" + hashlib.sha256(signature.encode()).hexdigest()[:16]

    return pd.Series([key(i) for i in frame.index], index=frame.index, dtype=object)


def _value_text(value) -> str:
    value = _plain(value)
    if value is None:
        return "unrecorded"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class SettingGroup:
    """The runs of one setting among a cell's candidates."""

    key: str
    runs: pd.DataFrame
    preferences_met: int

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def latest(self) -> str:
        if "started_at" not in self.runs.columns:
            return ""
        return max((str(v) for v in self.runs["started_at"] if not _missing(v)), default="")

    def settings(self) -> dict:
        """The group's value of every setting column (None where unrecorded; the latest run's
        value where its runs disagree, which only rows without ``setting_hash`` can)."""
        runs = self.runs.sort_values("started_at") if "started_at" in self.runs.columns else self.runs
        return {c: _plain(runs[c].iloc[-1]) for c in setting_columns(runs)}

    def difference(self, reference: SettingGroup) -> str:
        """``key=value`` for each setting in which this group differs from ``reference``."""
        mine, theirs = self.settings(), reference.settings()
        differing = [f"{c}={_value_text(mine.get(c))}" for c in SETTING_COLUMNS if mine.get(c) != theirs.get(c)]
        if differing:
            return ", ".join(differing)
        if self.key.startswith("hash:"):
            return f"setting_hash={self.key[5:13]}"
        return "settings unrecorded (row without setting_hash)"


@dataclass
class SettingChoice:
    """The candidate settings of a cell, best first: ``groups[0]`` is shown."""

    groups: list[SettingGroup]

    @property
    def shown(self) -> pd.DataFrame | None:
        return self.groups[0].runs if self.groups else None

    @property
    def left_out(self) -> list[SettingGroup]:
        return self.groups[1:]

    def note(self, name: str) -> str | None:
        """``<name>: not shown, k other settings matched: solver=lbfgs (n=1); ...`` or None."""
        if not self.left_out:
            return None
        shown = self.groups[0]
        k = len(self.left_out)
        parts = "; ".join(f"{g.difference(shown)} (n={g.n})" for g in self.left_out)
        return f"{name}: not shown, {k} other setting{'s' if k > 1 else ''} matched: {parts}"


def preferences_met(runs: pd.DataFrame, prefer: dict) -> int:
    return sum(bool(matches(runs, {k: v}).all()) for k, v in prefer.items())


def choose_setting(runs: pd.DataFrame, prefer: dict | None = None) -> SettingChoice:
    """Split ``runs`` into settings and rank them (see the module docstring); an empty frame
    gives a choice with no groups."""
    prefer = PREFERRED_SETTINGS if prefer is None else prefer
    if runs is None or runs.empty:
        return SettingChoice([])
    keys = setting_keys(runs)
    groups = [SettingGroup(key, runs[keys == key], 0) for key in sorted(set(keys))]
    for group in groups:
        group.preferences_met = preferences_met(group.runs, prefer)
    # Stable sorts from the least significant criterion up: key ascending, then latest, n and
    # preferences descending.
    groups.sort(key=lambda g: g.key)
    groups.sort(key=lambda g: g.latest, reverse=True)
    groups.sort(key=lambda g: (g.preferences_met, g.n), reverse=True)
    return SettingChoice(groups)


def preference_rule(prefer: dict | None = None) -> str:
    """One sentence describing how the shown setting is chosen (for captions and footers)."""
    prefer = PREFERRED_SETTINGS if prefer is None else prefer
    wanted = ", ".join(f"{k}={_value_text(v)}" for k, v in prefer.items()) or "none"
    return (
        "Where runs of several settings match, one is shown: the one meeting most preferred "
        f"settings ({wanted}), then the one with most runs, then the latest."
    )


def best_first(runs: pd.DataFrame, prefer: dict | None = None) -> pd.DataFrame:
    """``runs`` ordered from the least to the most preferred single run: by preferences met, then
    ``started_at`` (for a value read from one run, e.g. a cached baseline score: take the last)."""
    prefer = PREFERRED_SETTINGS if prefer is None else prefer
    if runs.empty:
        return runs
    score = sum((matches(runs, {k: v}).astype(int) for k, v in prefer.items()), pd.Series(0, index=runs.index))
    started = runs["started_at"].map(lambda v: "" if _missing(v) else str(v)) if "started_at" in runs else ""
    order = pd.DataFrame({"score": score, "started": started}, index=runs.index)
    return runs.loc[order.sort_values(["score", "started"], kind="mergesort").index]
