"""The paper's tables from the results store: one Markdown and one LaTeX file per table.

Each table is declared by a :class:`TableSpec`: which runs it reads (``where``), its rows and its
columns. A cell averages the finished runs that match ``where`` + the row's conditions + the
column's conditions (the latest finished run per config hash, so every seed counts once) and
says how many there are: ``0.634`` for one run, ``0.634 ± 0.002 (n=3)`` for several, ``—``
(missing) for none. A cell averages only runs identical except for the seed: when the matching
runs hold several settings (same ``setting_hash``; see ``selection.py``), the cell shows one, the
one meeting most of the table's and row's preferred settings (``prefer``, on top of
``selection.PREFERRED_SETTINGS``: bfloat16, mini-batch Adam), then with most runs, then the
latest; a note under the table names the settings left out and their runs. Three kinds of rows:

- ``measured``: runs of this project.
- ``baseline``: the unpruned model, read from the ``baseline_<metric>`` columns that every
  pruned run records for its model and eval suite (RP = 1, compression = 0 by definition).
- ``quoted``: numbers from other papers (``quoted_numbers.yaml``), in their own block, marked
  ``quoted`` with the source under the table; never averaged with measured runs. A measured row
  that runs a quoted method in this project's pipeline (``Row.run_of``) is labelled
  ``(this harness)`` and stands right after the quoted row of that method.

With a :class:`paper_settings.Target` (``make paper-tables MODEL= CALIBRATION= EVAL=``) every
cell's merged conditions are retargeted to another model, calibration set or suite (see
``paper_settings.py``); the caption says what was rendered instead of the paper's settings, and
quoted rows (numbers for the paper's model and suite) are left out.

    python -m replaceme_exp.reporting.render_paper --results results --out results/paper_tables
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from replaceme_exp.config.depth import blocks_to_prune
from replaceme_exp.reporting import version_marks
from replaceme_exp.reporting.artifacts import Sweep, register
from replaceme_exp.reporting.cells import (
    DEFAULTS_FOR_MISSING_COLUMNS,  # noqa: F401  (kept importable here)
    PREFERRED_SETTINGS,
    FractionOfDepth,
    best_first,
    choose_setting,
    preference_rule,
)
from replaceme_exp.reporting.compression_cost import with_compression_cost
from replaceme_exp.reporting.energy_marks import NOTE as ESTIMATED_NOTE
from replaceme_exp.reporting.energy_marks import any_estimated, is_energy_metric, marked
from replaceme_exp.reporting.paper_records import check_keys, conditions, paper_records
from replaceme_exp.reporting.paper_settings import (
    PAPER_HOME,
    Retargeting,
    Tally,
    Target,
    baseline_columns,
    finished_runs,
    latest_failure,
    latest_short_run,
    read_config,
    select_cell,
)
from replaceme_exp.reporting.paths import file_name
from replaceme_exp.reporting.ties import LEADERS_NOTE, Cell, draws_interval, interval_of, mark_column, stderr_of
from replaceme_exp.results.row import decode_cell, format_cuts
from replaceme_exp.results.store import ResultsStore
from replaceme_exp.row_format import PERPLEXITY_METRICS, metric_column

MISSING = "—"
# A row whose method says its training did not act (a run's ``untrained`` column, set by the method's
# plugin): its label carries the mark and the footer says what it means.
UNTRAINED, UNTRAINED_MARK = "untrained", "(untrained)"
UNTRAINED_NOTE = (
    f"Rows marked {UNTRAINED_MARK}: the method trains, but in these runs its training did not act (a learning "
    "rate of 0 or a handful of optimizer steps; the runs' untrained column): the row shows what it replaces the "
    "removed blocks with as initialised, not as trained."
)
HARNESS_MARK = "(this harness)"  # a quoted method run in this project's pipeline (Row.run_of)
QUOTED_NUMBERS = Path(__file__).with_name("quoted_numbers.yaml")
BASELINE_CONSTANTS = {"rp": 1.0, "compression_ratio": 0.0, "blocks_pruned_ratio": 0.0}
BASELINE_KEYS = ("model", "eval")  # what the unpruned model's scores depend on


@dataclass
class Column:
    header: str
    metric: str
    conditions: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SuiteAccuracies:
    """In a table's columns: one column per accuracy the table's eval suite records (its
    ``eval.harness.metrics`` that are not perplexities, ``<metric>_<task>``), for the suite the
    table is rendered from (``EVAL=`` retargets it)."""

    def columns(self, suite: str | None) -> list[Column]:
        if suite is None:
            return []
        try:
            harness = read_config("eval", suite).get("harness") or {}
        except (OSError, yaml.YAMLError):
            return []
        names, metrics = harness.get("ppl_names") or {}, harness.get("metrics") or {}
        return [
            Column(f"{task} ({metric})", metric_column(task, metric, names))
            for task, metric in metrics.items()
            if metric not in PERPLEXITY_METRICS
        ]


@dataclass
class Row:
    label: str
    conditions: dict = field(default_factory=dict)
    kind: str = "measured"  # measured | baseline
    text: dict = field(default_factory=dict)  # cells of the table's text columns
    prefer: dict = field(default_factory=dict)  # preferred settings, over the table's (see selection.py)
    # The quoted method (its label in quoted_numbers.yaml) this row runs in this project's pipeline: the
    # row is labelled "(this harness)" and stands right after that quoted row when the quoted rows show.
    run_of: str | None = None
    note: str | None = None  # said under the table, after the row's label (why a row reads as it does)

    def __post_init__(self):
        if self.kind not in ("measured", "baseline"):
            raise ValueError(f"Row {self.label!r}: kind={self.kind!r}, choose measured or baseline")
        if self.run_of is not None and self.kind != "measured":
            raise ValueError(f"Row {self.label!r}: run_of={self.run_of!r} names a run, a measured row")

    @property
    def shown_label(self) -> str:
        return f"{self.label} {HARNESS_MARK}" if self.run_of is not None else self.label


@dataclass
class TableSpec:
    name: str
    caption: str
    where: dict
    rows: list
    columns: list = field(default_factory=lambda: list(PAPER_COLUMNS))
    text_columns: list[str] = field(default_factory=list)
    quoted_at: int | None = None  # row index where the quoted block goes (None: no quoted rows)
    transpose: bool = False  # settings as columns, metrics as rows (the paper's layout)
    prefer: dict = field(default_factory=dict)  # preferred settings, over PREFERRED_SETTINGS
    sweeps: tuple[Sweep, ...] = ()  # the multirun templates that fill it, and their job counts
    modality: str = "text"  # the kind of model whose runs it reads (text, vision): paper_settings.row_modalities
    # The calibration (and size) the table reads unless CALIBRATION= says otherwise, and how its caption
    # names the settings a retargeting replaced: the paper's (paper_settings.PAPER_HOME), or the table's own.
    home: dict = field(default_factory=lambda: dict(PAPER_HOME))
    reference: str = "paper"
    note: str = ""  # what the table's rows rest on beyond its caption (rendered under the table)

    def preferences(self, row: Row) -> dict:
        """The settings a cell of ``row`` prefers when its runs hold several (see selection.py)."""
        return {**PREFERRED_SETTINGS, **self.prefer, **row.prefer}

    def row_specs(self) -> list[Row]:
        return [r if isinstance(r, Row) else Row(*r) for r in self.rows]

    def column_specs(self, suite: str | None = None) -> list[Column]:
        """The columns, :class:`SuiteAccuracies` expanded for ``suite`` (None: the table's own, ``where``'s)."""
        suite = suite if suite is not None else self.where.get("eval")
        out: list[Column] = []
        for c in self.columns:
            if isinstance(c, SuiteAccuracies):
                out += c.columns(suite)
            else:
                out.append(c if isinstance(c, Column) else Column(*c))
        return out


def _column(entry, where: str) -> list:
    """A table's column as written in paper.yaml: ``[header, metric]``, ``{header, metric, conditions}``,
    ``suite_accuracies``, or ``{use: <named column list>}``; returns the columns it stands for."""
    if entry == "suite_accuracies":
        return [SuiteAccuracies()]
    if isinstance(entry, list):
        return [Column(*entry)]
    if set(entry) == {"use"}:
        return [c for named in paper_records()["columns"][entry["use"]] for c in _column(named, where)]
    check_keys(entry, ("header", "metric", "conditions"), f"{where} column")
    return [Column(entry["header"], entry["metric"], conditions(entry.get("conditions"), where))]


def _row(entry: dict, where: str) -> Row:
    check_keys(entry, ("label", "conditions", "kind", "text", "prefer", "run_of", "note"), f"{where} row")
    return Row(
        entry["label"],
        conditions(entry.get("conditions"), where),
        entry.get("kind", "measured"),
        text=dict(entry.get("text") or {}),
        prefer=dict(entry.get("prefer") or {}),
        run_of=entry.get("run_of"),
        note=" ".join(entry["note"].split()) if entry.get("note") else None,
    )


def table_spec(entry: dict) -> TableSpec:
    """A :class:`TableSpec` from its entry in paper.yaml's ``tables``."""
    where = f"paper.yaml tables.{entry['name']}"
    unknown = sorted(set(entry) - set(TableSpec.__dataclass_fields__))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}")
    optional = {k: entry[k] for k in ("text_columns", "quoted_at", "transpose", "modality", "reference") if k in entry}
    if "columns" in entry:
        optional["columns"] = [c for written in entry["columns"] for c in _column(written, where)]
    if "home" in entry:
        optional["home"] = conditions(entry["home"], where)
    if "note" in entry:
        optional["note"] = " ".join(entry["note"].split())
    return TableSpec(
        entry["name"],
        " ".join(entry["caption"].split()),
        conditions(entry["where"], where),
        [_row(r, where) for r in entry["rows"]],
        prefer=dict(entry.get("prefer") or {}),
        sweeps=tuple(Sweep(template, jobs) for template, jobs in entry.get("sweeps", ())),
        **optional,
    )


PAPER_COLUMNS = [c for written in paper_records()["columns"]["paper"] for c in _column(written, "columns.paper")]
TASK_COLUMNS = [c for written in paper_records()["columns"]["tasks"] for c in _column(written, "columns.tasks")]
TABLES = [table_spec(entry) for entry in paper_records()["tables"]]


def table_named(name: str) -> TableSpec:
    """The table called ``name``."""
    return next(spec for spec in TABLES if spec.name == name)


# The methods tables (beyond the paper): one row per method at each compression (FractionOfDepth) of
# their ``where``; paper_figures' quality/speed figure reads the same rows.
METHODS_TABLES = ("methods_equal_compression", "methods_equal_compression_deeper")
METHODS_AT_EQUAL_COMPRESSION = [r for r in table_named(METHODS_TABLES[0]).row_specs() if r.kind == "measured"]


for _table in TABLES:
    register(_table.name, "table", _table.sweeps, _table)


def load_quoted(path: str | Path = QUOTED_NUMBERS) -> dict:
    """``{table: {"source": str, "rows": [{"label", "text", "values"}]}}`` with values scaled."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    out = {}
    for table, entry in data.items():
        scale = float(entry.get("scale", 1.0))
        rows = [
            {
                "label": r["label"],
                "text": dict(r.get("text") or {}),
                "values": {k: float(v) * scale for k, v in (r.get("values") or {}).items()},
            }
            for r in entry.get("rows", [])
        ]
        out[table] = {"source": " ".join(str(entry["source"]).split()), "rows": rows}
    return out


def format_value(value: float) -> str:
    return f"{value:.4g}"


def format_cell(values: pd.Series, interval: tuple[float, float] | None = None) -> str:
    """One run: its value, with its 95% ``interval`` ``[low, high]`` when it has one; several runs
    (seeds or calibration draws): ``mean ± std (n=k)``, the spread between them, with the 95% interval of
    the mean over both levels (runs and evaluation units: ``mean [low, high] ± std (n=k)``) when it has
    one; none: ``—``."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return MISSING
    if len(values) == 1:
        shown = format_value(values.iloc[0])
        return f"{shown} [{format_value(interval[0])}, {format_value(interval[1])}]" if interval else shown
    std = values.std(ddof=1)
    if math.isnan(std):
        return format_value(values.mean())
    mean = format_value(values.mean())
    shown = f"{mean} [{format_value(interval[0])}, {format_value(interval[1])}]" if interval else mean
    return f"{shown} ± {std:.2g} (n={len(values)})"


# What a speed was measured with, besides the architectures: runs that share all of them measured the same thing.
SPEED_CONDITIONS = (
    "speed_architecture",
    "speed_architecture_baseline",
    "speed_processor",
    "speed_device",
    "speed_dtype",
    "speed_threads",
    "speed_prompt_len",
    "speed_gen_len",
    "speed_batch",
    "speed_rounds",
)


def architecture_runs(finished: pd.DataFrame | None, run: pd.Series) -> pd.DataFrame | None:
    """The runs that measured ``run``'s pruned architecture against the same unpruned one, with the same
    speed settings on the same processor (not those that reused a figure: ``speed_reused``); None when
    ``run`` records no architecture (rows before 2026-12-07)."""
    if finished is None or not isinstance(run.get("speed_architecture"), str):
        return None
    if any(c not in finished.columns for c in SPEED_CONDITIONS):
        return None
    same = finished
    for column in SPEED_CONDITIONS:
        same = same[same[column].astype(str) == str(run.get(column))]
    if "speed_reused" in same.columns:
        same = same[~same["speed_reused"].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v))]
    return same


RANGE_NOTE = (
    "(floor): the task's score is within noise of its floor, the larger of chance and the trivial baseline that "
    "answers every item with the answer most frequent among the others (its interval reaches it); (ceiling): "
    "0.9 or more, little room to show a difference (docs/guides/offline-tasks.md)."
)


def range_mark(runs: pd.DataFrame, metric: str) -> str | None:
    """``floor`` or ``ceiling`` when every run of a cell of a task's score (``score_<task>``,
    ``<metric>_<task>``) says its score sits there (``score_range_<task>``); None otherwise."""
    marks = set()
    for _, run in runs.iterrows():
        declared = decode_cell(run.get("eval_metrics"))
        if not isinstance(declared, dict):
            return None
        task = next((t for t, m in declared.items() if metric in (f"score_{t}", f"{m}_{t}")), None)
        if task is None:
            return None
        marks.add(run.get(f"score_range_{task}"))
    found = marks.pop() if len(marks) == 1 else None
    return found if isinstance(found, str) else None


def draws_line(label: str, runs: pd.DataFrame) -> str | None:
    """``<label>: blocks removed per calibration draw: <cuts> (draw 0), ...`` for a row of several runs
    that record their cuts (None otherwise): the spread of the selection itself."""
    if len(runs) < 2 or "cuts" not in runs.columns:
        return None
    by_cuts: dict[str, list[str]] = {}
    for _, run in runs.iterrows():
        draw = run.get("calibration_draw")
        name = f"draw {int(draw)}" if isinstance(draw, (int, np.integer, float)) and not pd.isna(draw) else "a run"
        seed = run.get("seed")
        name += f", seed {int(seed)}" if len(set(runs.get("seed", pd.Series(dtype=float)).dropna())) > 1 else ""
        by_cuts.setdefault(format_cuts(run.get("cuts"), missing="none"), []).append(name)
    parts = [f"{cuts} ({'; '.join(names)})" for cuts, names in by_cuts.items()]
    return f"{label}: blocks removed by each of its {len(runs)} runs: " + ", ".join(parts)


def run_interval(run: pd.Series, metric: str) -> tuple[float, float] | None:
    """A single run's interval of ``metric``: its recorded one (:func:`ties.interval_of`: held-out
    perplexity and avg-acc, 95%; a speedup, its rounds' range), else ``±1.96`` of its standard error (a
    task's score), kept within what the metric can be (a share of items: [0, 1]; rp: >= 0); None without."""
    low, high = interval_of(run, metric)
    if low is not None and high is not None:
        return low, high
    value, se = pd.to_numeric(pd.Series([run.get(metric)]), errors="coerce").iloc[0], stderr_of(run, metric)
    if se is None or math.isnan(value) or metric.startswith("ppl") or metric.endswith("_speedup"):
        return None
    top = math.inf if metric == "rp" else 1.0
    return max(0.0, float(value - 1.96 * se)), min(top, float(value + 1.96 * se))


def bold(text: str) -> str:
    return f"**{text}**"


def with_derived_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """Columns computed from recorded ones: ``blocks_pruned_ratio`` = n_prune / num_layers, and
    the compression stages' summed time and CO2 (``compression_cost.with_compression_cost``)."""
    runs = with_compression_cost(runs).copy()  # one block of columns: the frame arrives fragmented
    if {"n_prune", "num_layers"} <= set(runs.columns):
        runs["blocks_pruned_ratio"] = pd.to_numeric(runs["n_prune"], errors="coerce") / pd.to_numeric(
            runs["num_layers"], errors="coerce"
        )
    return runs


def _baseline_cell(selected: pd.DataFrame, metric: str, prefer: dict | None = None) -> str:
    if selected.empty:
        return MISSING
    if metric in BASELINE_CONSTANTS:
        return format_value(BASELINE_CONSTANTS[metric])
    # baseline_<metric>, else an older or differently named column (avg_acc_baseline, ppl_heldout_baseline).
    column = next((c for c in baseline_columns(metric) if c in selected.columns), None)
    if column is None:
        return MISSING
    # Every run of a (model, suite) reads the same cached baseline: one value, not a mean over
    # seeds; from the latest run among those meeting most preferred settings (e.g. the dtype).
    values = pd.to_numeric(best_first(selected, prefer)[column], errors="coerce").dropna()
    if values.empty:
        return MISSING
    unpruned = _as_unpruned_run(selected.loc[values.index[-1]])
    return format_cell(values.iloc[-1:], run_interval(unpruned, metric) if metric in unpruned.index else None)


def _as_unpruned_run(run: pd.Series) -> pd.Series:
    """The unpruned model's columns of ``run`` under the names a pruned run's have (``baseline_avg_acc_ci_low``
    -> ``avg_acc_ci_low``, ``ppl_heldout_baseline_ci_high`` -> ``ppl_heldout_ci_high``), so that its
    interval reads as a run's."""
    renamed = {}
    for name, value in run.items():
        if name.startswith("baseline_"):
            renamed[name[len("baseline_") :]] = value
        elif "_baseline" in name:
            renamed.setdefault(name.replace("_baseline", "", 1), value)
    return pd.Series(renamed, dtype=object)


def row_name(spec: TableSpec, row: Row) -> str:
    """How notes name a row: its label and its text cells (``ReplaceMe, Linear (Cosine)``)."""
    texts = [str(row.text.get(t, "")) for t in spec.text_columns]
    return ", ".join([row.label] + [t for t in texts if t and t != "-"])


def _condition_key(conditions: dict) -> str:
    return json.dumps(conditions, sort_keys=True, default=str)


def _short_line(label: str, short: pd.Series | None, conditions: dict) -> str | None:
    """``<row>: no run at this compression; its latest run asked for <n> of <depth> blocks
    (n_prune=<as given>) and removed <m> (cuts <cuts>)`` (None: no such run)."""
    if short is None:
        return None
    depth = next(v for v in conditions.values() if isinstance(v, FractionOfDepth))
    layers = int(short["num_layers"])
    asked = blocks_to_prune(float(depth.fraction), layers)
    return (
        f"{label}: no run at this compression; its latest run asked for {asked} of {layers} blocks "
        f"(n_prune={short['n_prune_asked']}) and removed {int(short['n_prune'])} (cuts {short.get('cuts')})"
    )


def _failure_line(label: str, failure: pd.Series | None) -> str | None:
    """``<row>: no finished run; its latest run failed in stage <stage>: <error>`` (None: no failure)."""
    if failure is None:
        return None
    stage = failure.get("failed_stage")
    where = f" in stage {stage}" if isinstance(stage, str) and stage else ""
    return f"{label}: no finished run; its latest run failed{where}: {str(failure['error']).rstrip('.')}"


@dataclass
class _Rendering:
    """What :func:`build_table` gathers while it fills the rows: the rows' cells in order, the notes
    on settings left out, the failure lines of rows without a finished run, whether any energy was
    estimated, the measured cells per column for the leaders, and the cells of the rows that run a
    quoted method (by the quoted label)."""

    out: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    row_notes: list[str] = field(default_factory=list)
    estimated: bool = False
    ranges: bool = False  # a task's score at its floor or near its ceiling was marked
    off_version: list[str] = field(default_factory=list)  # libraries (version_marks) a shown row was off
    untrained: bool = False
    ranked: dict[str, dict[int, Cell]] = field(default_factory=dict)  # header -> {id of the row's cells: cell}
    runs_of: dict[str, list[dict]] = field(default_factory=dict)
    finished: pd.DataFrame | None = None  # every finished run, for a speed's architecture


def build_table(
    spec: TableSpec, runs: pd.DataFrame, quoted: dict | None = None, target: Target | None = None
) -> pd.DataFrame:
    """The table as displayed strings: ``Setting``, the text columns, ``Runs`` (how many runs
    stand behind the row's shown cells, ``unpruned`` or ``quoted``) and one column per metric
    column. A cell reads the runs matching ``spec.where`` + the row's + the column's conditions,
    retargeted to ``target`` (:class:`paper_settings.Retargeting`; None: the paper's settings), and
    shows one setting of them (:func:`selection.choose_setting` with ``spec.preferences(row)``).
    ``table.attrs``: ``notes`` lists, per row (and per column condition), the settings that matched
    and were left out (rendered under the table); ``retargeted`` what was rendered instead of the
    paper's settings (None when nothing); ``counts`` the line saying how many runs were found,
    matched and shown (:class:`paper_settings.Tally`)."""
    finished = with_derived_columns(finished_runs(runs, spec.modality))
    retarget, tally = Retargeting(target, spec.home, spec.reference), Tally()
    suite = retarget.target.eval if retarget.active and retarget.target.eval is not None else None
    columns = []
    for column in spec.column_specs(suite):
        metric, header = retarget.metric(column.metric)  # e.g. Lambada's perplexity -> the suite's
        columns.append(Column(header or column.header, metric, column.conditions))
    rendering = _Rendering(finished=finished)
    for row in spec.row_specs():
        cells = {"Setting": row.shown_label, **{t: row.text.get(t, "") for t in spec.text_columns}}
        if row.run_of is not None:
            rendering.runs_of.setdefault(row.run_of, []).append(cells)
        if row.kind == "baseline":
            conditions = {k: v for k, v in {**spec.where, **row.conditions}.items() if k in BASELINE_KEYS}
            selected = select_cell(finished, retarget.conditions(conditions))
            cells["Runs"] = "unpruned"
            cells.update({c.header: _baseline_cell(selected, c.metric, spec.preferences(row)) for c in columns})
        else:
            shown = _shown_settings(spec, row, columns, finished, retarget, tally, rendering.notes)
            cells["Runs"] = len(set().union(*(frame.index for frame in shown.values()))) if shown else 0
            if not cells["Runs"]:
                conditions = retarget.conditions({**spec.where, **row.conditions})
                short = latest_short_run(runs, conditions, spec.modality)
                line = _short_line(row.shown_label, short, conditions)
                if line is None:
                    line = _failure_line(row.shown_label, latest_failure(runs, conditions, spec.modality))
                if line is not None:
                    rendering.failures.append(line)
            _fill_measured_cells(cells, columns, shown, rendering)
            _mark_row(cells, shown, rendering)
            widest = max(shown.values(), key=len) if shown else None
            if widest is not None and (line := draws_line(row.shown_label, widest)) is not None:
                rendering.row_notes.append(line)
        if row.note:
            rendering.row_notes.append(f"{row.shown_label}: {row.note.rstrip('.')}")
        rendering.out.append(cells)
    led = _mark_leaders(rendering.out, columns, rendering.ranked)
    has_quoted = spec.quoted_at is not None and quoted and spec.name in quoted
    out = rendering.out
    if has_quoted and not retarget.active:
        out = _with_quoted_rows(spec, out, columns, quoted[spec.name]["rows"], rendering.runs_of)
    table = pd.DataFrame(out)
    if spec.transpose:
        table = table.set_index("Setting").T.reset_index().rename(columns={"index": ""})
    retargeted = retarget.caption()
    if retargeted and has_quoted:
        retargeted += " The quoted rows of other papers (the paper's model and suite) are left out."
    table.attrs.update(notes=rendering.notes, retargeted=retargeted, counts=tally.line(spec.name))
    table.attrs.update(estimated=rendering.estimated, failures=rendering.failures, off_version=rendering.off_version)
    table.attrs.update(ranges=rendering.ranges)
    table.attrs.update(untrained=rendering.untrained, row_notes=rendering.row_notes)
    table.attrs.update(harness_rows=bool(rendering.runs_of), leaders=led)
    return table


def _untrained(runs: pd.DataFrame) -> bool:
    """Whether any of ``runs`` says its training did not act (``untrained`` true; missing: not a trained method)."""
    if UNTRAINED not in runs.columns:
        return False
    return bool(runs[UNTRAINED].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v)).any())


def _shown_settings(
    spec: TableSpec,
    row: Row,
    columns: list[Column],
    finished: pd.DataFrame,
    retarget: Retargeting,
    tally: Tally,
    notes: list[str],
) -> dict[str, pd.DataFrame]:
    """The runs a measured row shows, per distinct column condition (columns without conditions share
    the row's): one setting of those matching (:func:`choose_setting`), an empty frame where none
    match; the settings left out are appended to ``notes``."""
    shown: dict[str, pd.DataFrame] = {}
    for column in columns:
        key = _condition_key(column.conditions)
        if key in shown:
            continue
        conditions = retarget.conditions({**spec.where, **row.conditions, **column.conditions})
        in_cell = tally.cell(finished, conditions)
        choice = choose_setting(in_cell, spec.preferences(row))
        tally.show(choice.shown)
        shown[key] = choice.shown if choice.shown is not None else in_cell.iloc[0:0]
        headers = [c.header for c in columns if _condition_key(c.conditions) == key]
        name = row_name(spec, row) + (f" [{', '.join(headers)}]" if column.conditions else "")
        if (note := choice.note(name)) is not None:
            notes.append(note)
    return shown


def _mark_row(cells: dict, shown: dict[str, pd.DataFrame], rendering: _Rendering) -> None:
    """Mark a measured row's label where its shown runs were not trained (``untrained``) or were scored with
    other library versions than their protocol's (:mod:`version_marks`)."""
    if any(_untrained(frame) for frame in shown.values()):
        cells["Setting"], rendering.untrained = f"{cells['Setting']} {UNTRAINED_MARK}", True
    off = {library for frame in shown.values() for library in version_marks.off_protocol(frame)}
    for library in [name for name in version_marks.LIBRARIES if name in off]:
        cells["Setting"] = f"{cells['Setting']} {version_marks.mark(library)}"
        if library not in rendering.off_version:
            rendering.off_version.append(library)


def _fill_measured_cells(
    cells: dict, columns: list[Column], shown: dict[str, pd.DataFrame], rendering: _Rendering
) -> None:
    """Write a measured row's metric cells into ``cells`` from its shown runs, and note each for the
    leaders (``rendering.ranked``) and any estimated energy."""
    for column in columns:
        in_cell = shown[_condition_key(column.conditions)]
        metric = column.metric
        same = architecture_runs(rendering.finished, in_cell.iloc[0]) if len(in_cell) == 1 else None
        if metric.endswith("_speedup") and same is not None and metric in same.columns:
            # one figure per architecture: the jobs that measured it (median, and their range)
            values = pd.to_numeric(same[metric], errors="coerce").dropna()
            if len(values) > 1:
                low, high = format_value(values.min()), format_value(values.max())
                cells[column.header] = f"{format_value(values.median())} [{low}, {high}] ({len(values)} jobs)"
                ranked = rendering.ranked.setdefault(column.header, {})
                ranked[id(cells)] = Cell(float(values.median()), same.loc[values.index])
                continue
        if metric in in_cell.columns:
            values = pd.to_numeric(in_cell[metric], errors="coerce").dropna()
            runs_ = in_cell.loc[values.index]
            interval = run_interval(in_cell.iloc[0], metric) if len(values) == 1 else draws_interval(runs_, metric)
            cells[column.header] = format_cell(in_cell[metric], interval)
            mean = float(values.mean()) if not values.empty else None
            rendering.ranked.setdefault(column.header, {})[id(cells)] = Cell(mean, in_cell.loc[values.index])
        else:
            cells[column.header] = MISSING
        if is_energy_metric(metric) and any_estimated(in_cell):
            cells[column.header] = marked(cells[column.header], True)
            rendering.estimated = True
        if (mark := range_mark(in_cell, metric)) is not None:
            cells[column.header] = f"{cells[column.header]} ({mark})"
            rendering.ranges = True


def _with_quoted_rows(
    spec: TableSpec, out: list[dict], columns: list[Column], quoted_rows: list[dict], runs_of: dict[str, list[dict]]
) -> list[dict]:
    """The rows with the quoted block at ``spec.quoted_at``, each quoted row followed by the rows that
    run its method here (moved from where they stood)."""
    beside = [c for entry in quoted_rows for c in runs_of.get(entry["label"], [])]
    at = spec.quoted_at - sum(any(c is r for r in beside) for c in out[: spec.quoted_at])
    out = [c for c in out if not any(c is r for r in beside)]
    block = []
    for entry in quoted_rows:
        cells = {"Setting": f"{entry['label']} (quoted)"}
        cells.update({t: entry["text"].get(t, "") for t in spec.text_columns})
        cells["Runs"] = "quoted"
        for column in columns:
            value = entry["values"].get(column.header)
            cells[column.header] = format_value(value) if value is not None else MISSING
        block += [cells, *runs_of.get(entry["label"], [])]
    out[at:at] = block
    return out


def _mark_leaders(out: list[dict], columns: list[Column], ranked: dict[str, dict[int, Cell]]) -> bool:
    """Bold, in place, each column's leaders among the measured rows (:func:`ties.mark_column`);
    returns whether any column was ranked."""
    by_id = {id(cells): cells for cells in out}
    led = False
    for column in columns:
        marks = mark_column(ranked.get(column.header, {}), column.metric)
        for key in marks:
            by_id[key][column.header] = bold(by_id[key][column.header])
        led = led or bool(marks)
    return led


def table_notes(table: pd.DataFrame) -> list[str]:
    """The notes :func:`build_table` attached: the settings that matched a row and were left out."""
    return list(table.attrs.get("notes", []))


def caption(spec: TableSpec, table: pd.DataFrame | None = None) -> str:
    """The table's caption and, when retargeted, what it was rendered from."""
    retargeted = table.attrs.get("retargeted") if table is not None else None
    return f"{spec.caption} {retargeted}" if retargeted else spec.caption


def _footer(spec: TableSpec, quoted: dict | None, table: pd.DataFrame | None = None, bullet: str = "") -> list[str]:
    lines = [
        "Cells average the finished runs of one setting, which differ only in the seed or the calibration "
        "draw (mean [95% interval over the runs and the documents or items, where they share them] ± std between "
        f"the runs (n)); a single run shows its 95% interval in brackets where it has one (held-out "
        "perplexity: a bootstrap over documents (windows for older rows); avg-acc: over items, by cluster where "
        "a task declares them; a task's score: ±1.96 lm-eval standard "
        f"errors, within [0, 1]; a speedup: over its timing rounds); {MISSING} = no finished run; "
        "Runs counts the runs shown."
    ]
    if spec.note:
        lines.append(spec.note)
    if table is not None and table.attrs.get("leaders"):
        lines.append(LEADERS_NOTE)
    lines += [f"{bullet}{failure}." for failure in (table.attrs.get("failures", []) if table is not None else [])]
    lines += [f"{bullet}{note}." for note in (table.attrs.get("row_notes", []) if table is not None else [])]
    if table is not None and table.attrs.get("untrained"):
        lines.append(UNTRAINED_NOTE)
    retargeted = table is not None and table.attrs.get("retargeted")
    if spec.quoted_at is not None and quoted and spec.name in quoted and not retargeted:
        lines.append(f"Rows marked quoted are not measured here; source: {quoted[spec.name]['source']}.")
    if table is not None and table.attrs.get("harness_rows"):
        lines.append(
            f"Rows marked {HARNESS_MARK} run a method that other papers report in this project's pipeline, "
            "with this table's model, calibration data and eval suite (not the quoted papers' own)."
        )
    if table is not None and table.attrs.get("estimated"):
        lines.append(ESTIMATED_NOTE)
    if table is not None and table.attrs.get("ranges"):
        lines.append(RANGE_NOTE)
    if table is not None:
        off = table.attrs.get("off_version") or ()
        lines += [version_marks.note(library) for library in version_marks.LIBRARIES if library in off]
    notes = table_notes(table) if table is not None else []
    if notes:
        lines.append(preference_rule({**PREFERRED_SETTINGS, **spec.prefer}))
        lines += [f"{bullet}{note}." for note in notes]
    return lines


def to_markdown(spec: TableSpec, table: pd.DataFrame, quoted: dict | None = None) -> str:
    headers = list(table.columns)
    lines = [f"**{spec.name}**: {caption(spec, table)}", ""]
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    lines += [""] + _footer(spec, quoted, table, bullet="- ")
    return "\n".join(lines) + "\n"


def to_latex(spec: TableSpec, table: pd.DataFrame, quoted: dict | None = None) -> str:
    def esc(v) -> str:
        text = str(v).replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")
        text = text.replace("±", r"$\pm$").replace(MISSING, "--")
        return rf"\textbf{{{text[2:-2]}}}" if text.startswith("**") and text.endswith("**") else text

    headers = list(table.columns)
    lines = [r"\begin{table}[h]", r"\centering", r"\begin{tabular}{l" + "c" * (len(headers) - 1) + "}", r"\toprule"]
    lines.append(" & ".join(rf"\textbf{{{esc(h)}}}" for h in headers) + r" \\")
    lines.append(r"\midrule")
    previous = None
    for row in table.itertuples(index=False):
        kind = "quoted" if "quoted" in row else "other"
        if previous is not None and kind != previous:
            lines.append(r"\midrule")
        lines.append(" & ".join(esc(v) for v in row) + r" \\")
        previous = kind
    text = " ".join([caption(spec, table)] + _footer(spec, quoted, table))
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        rf"\caption{{{esc(text)}}}",
        rf"\label{{tab:{spec.name}}}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def write_paper_tables(
    results_dir: str | Path,
    out_dir: str | Path,
    runs: pd.DataFrame | None = None,
    target: Target | None = None,
    echo=None,
    only: list[str] | None = None,
) -> list[Path]:
    """Write ``<name>.md`` and ``<name>.tex`` for every table (those named in ``only``, when given;
    retargeted to ``target``, if given); returns the files written. ``echo`` (e.g. ``print``) gets
    each table's count line."""
    if runs is None:
        runs = ResultsStore(results_dir).load(latest_per_config=True)
    quoted = load_quoted()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in TABLES:
        if only is not None and spec.name not in only:
            continue
        table = build_table(spec, runs, quoted, target)
        for suffix, render in ((".md", to_markdown), (".tex", to_latex)):
            path = out / f"{file_name(spec.name)}{suffix}"
            path.write_text(render(spec, table, quoted))
            written.append(path)
        if echo is not None:
            echo(table.attrs["counts"])
    return written
