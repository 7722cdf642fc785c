"""Reports for any results store: ``make report`` (``RESULTS=dir``, default ``results``).

Writes under ``<results>/report/``: ``index.md`` (one line per sweep, with its counts), ``all.md`` (every
finished run in one table: no figure) and, per sweep, ``sweeps/<sweep_id>.md``: one overview that
answers what the sweep asked. It names the swept settings (:func:`~.overview.sweep_axes`: what varies,
derived columns folded into the setting they follow, explicit cuts included) and the fixed ones, shows a
handful of figures (held-out perplexity, average accuracy, the tasks' scores, the cosine distance after
T, CLIP's benchmarks; :mod:`.overview`) with the swept settings as axes, the unpruned model as a dashed
line and standard errors as bars, and a table of its runs with an ``unpruned`` row first, each number
rounded to the digits its standard error supports (:mod:`.precision`). Unlike the paper's tables nothing
is averaged in the tables: one line per run, a missing number stays ``—``.

A sweep's page covers every job of the sweep. A job skipped because its configuration had finished
before (its row under ``skips/``: :meth:`~replaceme_exp.results.store.ResultsStore.load_skips`) is
shown by the run that finished it, marked ``skipped: run of sweep <id>`` in the runs table, drawn in
the figures like any run, and counted: ``2 finished, 1 skipped (finished before), 0 failed``. A run is
shown once per table, however many of the sweep's jobs it stands for.

Failed runs (killed, stopped, refused: a typo) are out of the way: counted, listed only with
``--show-failed`` (``make report SHOW_FAILED=1``); a sweep with no finished run is listed in the index
only then. ``make clean-failed RESULTS=dir`` removes them from the store
(:mod:`replaceme_exp.results.cleaning`).

    python -m replaceme_exp.reporting.report --results results [--out results/report] [--show-failed]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from replaceme_exp.reporting.cells import SETTING_COLUMNS
from replaceme_exp.reporting.energy_marks import any_estimated, is_energy_metric, marked
from replaceme_exp.reporting.overview import (
    axis_values,
    baselines,
    draw,
    is_numeric,
    metric_panels,
    stderrs,
    sweep_axes,
    value_label,
)
from replaceme_exp.reporting.paths import file_name
from replaceme_exp.reporting.precision import format_measure, format_number
from replaceme_exp.reporting.ties import LEADERS_NOTE, Cell, interval_of, mark_column
from replaceme_exp.results.store import SKIPPED, ResultsStore, latest_of_each_config, started_text

MISSING = "—"
# Settings that can vary within a group (pruning or evaluate job and what it evaluated, the setting
# columns, the seed; cuts are a result).
VARYING_CANDIDATES = (
    ("job", "evaluated_checkpoint") + tuple(c for c in SETTING_COLUMNS if c != "model_fingerprint") + ("seed",)
)
# Metrics of the runs table, in this order, where a group records them.
TABLE_METRICS = (
    "ppl_heldout_baseline",
    "ppl_heldout_before_healing",
    "ppl_heldout",
    "avg_acc_baseline",
    "avg_acc",
    "rp",
    "cos_dist_before",
    "cos_dist_after",
    "compression_ratio",
    "vision_compression_ratio",
    "speed_prefill_speedup",
    "speed_decode_b1_speedup",
    "speed_decode_batch_speedup",
    "peak_infer_mem_gb",
    "checkpoint_bytes",
    "time_capture_s",
    "time_estimate_s",
    "time_heal_s",
    "time_eval_s",
    "time_total_s",
    "energy_kwh",
    "co2_kg",
)
ACCURACY_PREFIXES = ("acc_", "acc_norm_")
# The CLIP benchmarks' columns (replaceme_exp/pipeline/vision.py), pruned model only.
CLIP_PREFIXES = ("acc1_", "acc5_", "mean_avg_p_", "text_recall5_", "vision_recall5_")


@dataclass
class Group:
    """The jobs of one sweep (or of all sweeps): ``shown`` the finished runs (the latest per config
    hash) of its finished jobs, then those its skipped jobs stand for (the runs that finished their
    configuration before: column :data:`FINISHED_HERE` false), each once, with :data:`SKIPPED_JOBS`
    the group's skipped jobs a line stands for; ``failed`` the failed runs whose configuration never
    finished (the latest per config hash); ``n_finished`` / ``n_skipped`` its finished and skipped
    jobs; ``not_shown`` the number of other rows per reason. The all-runs group (``name`` ``all``)
    shows each configuration's latest finished run and counts the skipped jobs, without marking them."""

    name: str
    title: str
    n_read: int
    shown: pd.DataFrame
    failed: pd.DataFrame
    not_shown: dict[str, int] = field(default_factory=dict)
    n_finished: int = 0
    n_skipped: int = 0

    @property
    def n_not_shown(self) -> int:
        return sum(self.not_shown.values())

    def counts(self) -> str:
        """``2 finished, 1 skipped (finished before), 0 failed; read 4 rows`` and the rows not shown."""
        reasons = "; ".join(f"{n} {why}" for why, n in self.not_shown.items())
        return (
            f"{self.n_finished} finished, {self.n_skipped} skipped (finished before), {len(self.failed)} failed; "
            f"read {self.n_read} rows" + (f", {self.n_not_shown} not shown ({reasons})" if reasons else "")
        )


# Columns the report adds to a group's shown runs.
FINISHED_HERE = "_finished_here"  # the run is one of the group's own jobs (false: a skipped job's earlier run)
SKIPPED_JOBS = "_skipped_jobs"  # how many of the group's skipped jobs the run stands for


def _statuses(rows: pd.DataFrame) -> pd.Series:
    return rows["status"] if "status" in rows.columns else pd.Series(None, index=rows.index, dtype=object)


def skipped_runs(skips: pd.DataFrame, finished: pd.DataFrame) -> list:
    """For each skipped job's row in ``skips``, the index in ``finished`` (the store's finished runs)
    of the run it stands for: the one its ``finished_run_id`` names, else (that row was removed, or
    predates the column) the latest finished run of its configuration; None when there is none."""
    if skips.empty:
        return []
    latest = latest_of_each_config(finished) if not finished.empty else finished
    by_config = dict(zip(latest["config_hash"], latest.index)) if not latest.empty else {}
    by_id = dict(zip(finished["run_id"], finished.index)) if not finished.empty else {}
    named = skips["finished_run_id"] if "finished_run_id" in skips.columns else pd.Series(None, index=skips.index)
    return [by_id.get(run_id, by_config.get(chash)) for run_id, chash in zip(named, skips["config_hash"])]


def split_runs(
    rows: pd.DataFrame,
    name: str,
    title: str,
    skips: pd.DataFrame | None = None,
    store_finished: pd.DataFrame | None = None,
) -> Group:
    """Sort one group's rows (its runs' ``rows`` and its skipped jobs' ``skips``) into shown, failed
    and not shown (with the reason of each). A skipped job is shown by the run that finished its
    configuration before (looked up among ``store_finished``, the store's finished runs; default:
    ``rows``' own), once per configuration, beside the group's own finished runs. The latest run of
    a configuration is its latest by ``run_seq`` (``oldest_first``: not by a node's clock); the
    tables list runs by ``started_at``."""
    skips = skips if skips is not None else pd.DataFrame()
    if "config_hash" not in rows.columns:  # a sweep whose every job was skipped: no run of its own
        rows = pd.DataFrame(columns=["run_id", "config_hash", "status"], index=rows.index)
    status = _statuses(rows)
    ordered = rows.assign(_started=started_text(rows)).sort_values("_started", kind="mergesort")
    finished = ordered[status.loc[ordered.index] == "finished"]
    here = latest_of_each_config(finished)
    not_shown: dict[str, int] = {}
    if len(finished) > len(here):
        not_shown["older finished runs of a configuration shown by its latest run"] = len(finished) - len(here)
    pool = store_finished if store_finished is not None else rows[status == "finished"]
    shown_hashes, stand_for, earlier = set(here["config_hash"]), {}, []
    lost = 0
    for index in skipped_runs(skips, pool):
        if index is None:
            lost += 1
            continue
        chash = pool.loc[index, "config_hash"]
        stand_for[chash] = stand_for.get(chash, 0) + 1
        if chash not in shown_hashes:
            shown_hashes.add(chash)
            earlier.append(index)
    if lost:
        not_shown["skipped jobs whose finished run is no longer in the store"] = lost
    mine = here.drop(columns=["_started"]).assign(**{FINISHED_HERE: True})
    theirs = pool.loc[earlier].assign(**{FINISHED_HERE: False})
    shown = pd.concat([mine, theirs]) if len(mine) and len(theirs) else theirs if len(theirs) else mine
    shown[SKIPPED_JOBS] = shown["config_hash"].map(lambda h: stand_for.get(h, 0)) if len(shown) else []
    failed_all = ordered[status.loc[ordered.index] == "failed"]
    later_finished = failed_all["config_hash"].isin(shown_hashes)
    if int(later_finished.sum()):
        not_shown["failed runs of a configuration that also finished"] = int(later_finished.sum())
    failed_only = failed_all[~later_finished]
    failed = latest_of_each_config(failed_only)
    if len(failed_only) > len(failed):
        not_shown["older failures of a configuration listed by its latest failure"] = len(failed_only) - len(failed)
    other = ordered[~status.loc[ordered.index].isin(["finished", "failed", SKIPPED])]
    for value, count in other["status"].fillna("none").value_counts().items() if len(other) else []:
        not_shown[f"rows with status={value} (unfinished: killed or still running)"] = int(count)
    return Group(
        name, title, len(rows) + len(skips), shown, failed.drop(columns=["_started"]), not_shown, len(here), len(skips)
    )


def _plain(value):
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def varying_settings(frame: pd.DataFrame) -> list[str]:
    """The setting columns (and ``seed``) with more than one distinct value among ``frame``'s
    rows (an unrecorded value counts as one value)."""
    return [
        c
        for c in VARYING_CANDIDATES
        if c in frame.columns and len({json.dumps(_plain(v), default=str) for v in frame[c]}) > 1
    ]


def fixed_settings(frame: pd.DataFrame) -> dict:
    """The setting columns with one recorded value in ``frame``."""
    out = {}
    for c in VARYING_CANDIDATES:
        if c in frame.columns and c not in varying_settings(frame[[c]]):
            value = _plain(frame[c].iloc[0]) if len(frame) else None
            if value is not None:
                out[c] = value
    return out


def metric_columns(frame: pd.DataFrame) -> list[str]:
    """The key metrics ``frame`` records (at least one number), table order; then each task's score
    (``score_<task>``, the suite's declared metric; else the accuracies) and CLIP's benchmarks."""

    def recorded(c: str) -> bool:
        return c in frame.columns and pd.to_numeric(frame[c], errors="coerce").notna().any()

    scores = score_columns(frame)
    accuracy = scores or sorted(
        c for c in frame.columns if c.startswith(ACCURACY_PREFIXES) and "stderr" not in c and "_ci_" not in c
    )
    clip = sorted(c for c in frame.columns if c.startswith(CLIP_PREFIXES))
    return [c for c in TABLE_METRICS if recorded(c)] + [c for c in accuracy + clip if recorded(c)]


# Shown as recorded (4 significant digits), not through the precision of a standard error.
AS_RECORDED = ("energy_kwh", "co2_kg")


def _cell(value) -> str:
    value = _plain(value)
    if value is None:
        return MISSING
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/")


def _cuts(value) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return MISSING
    return " ".join(f"[{s},{e})" for s, e in value)


def _measure_cells(frame: pd.DataFrame, metric: str) -> pd.Series:
    """Each run's ``metric``: with its 95% interval ``[low, high]`` where the run records one (held-out
    perplexity, speedups), else rounded to its standard error where it has one (:func:`format_measure`);
    the column's leaders (:func:`~.ties.mark_column`) in bold."""
    if metric in AS_RECORDED:
        return frame[metric].map(_cell)
    values = pd.to_numeric(frame[metric], errors="coerce")
    errors = stderrs(frame, metric)
    shown = []
    for index, value, error in zip(frame.index, values, errors):
        low, high = interval_of(frame.loc[index], metric)
        if low is not None and high is not None and (metric.startswith("ppl") or not np.isfinite(error)):
            shown.append(f"{format_number(value)} [{format_number(low)}, {format_number(high)}]")
        else:
            shown.append(format_measure(value, error))
    cells = {i: Cell(float(v) if np.isfinite(v) else None, frame.loc[[i]]) for i, v in zip(frame.index, values)}
    for index in mark_column(cells, metric):
        shown[frame.index.get_loc(index)] = f"**{shown[frame.index.get_loc(index)]}**"
    return pd.Series(shown, index=frame.index, dtype=object)


BASELINE_CONSTANTS = {"rp": 1.0}
IN_UNPRUNED_ROW = ("ppl_heldout_baseline", "avg_acc_baseline")  # the runs table's first row shows them


def baseline_cell(frame: pd.DataFrame, metric: str) -> str:
    """The unpruned model's ``metric`` over ``frame``'s runs: its value when they share one,
    ``varies`` when they do not (another eval setting), ``—`` when none is recorded."""
    if metric in BASELINE_CONSTANTS:
        return format_measure(BASELINE_CONSTANTS[metric])
    values = baselines(frame, metric)
    errors = stderrs(frame, metric, "baseline_")
    present = values.dropna()
    if present.empty:
        return MISSING
    if present.round(12).nunique() > 1:
        return "varies"
    return format_measure(present.iloc[0], errors.loc[present.index[0]])


def job_cell(run: pd.Series) -> str:
    """What a shown run is to its group: ``finished`` (its own job), ``finished + 1 skipped`` (and
    the configuration of a skipped job of the group), ``skipped: run of sweep <id>`` (the earlier run
    of a skipped job's configuration; ``2 skipped: ...`` for two such jobs)."""
    jobs = int(run.get(SKIPPED_JOBS) or 0)
    if bool(run.get(FINISHED_HERE, True)):
        return "finished" + (f" + {jobs} skipped" if jobs else "")
    sweep = run.get("sweep_id")
    origin = f"run of sweep {sweep}" if isinstance(sweep, str) and sweep else "run of no sweep"
    return f"{jobs if jobs > 1 else ''} skipped: {origin}".strip()


def marks_jobs(group: Group) -> bool:
    """Whether a sweep's runs table needs its ``job`` column: a run stands for a skipped job."""
    frame = group.shown
    if group.name == "all" or SKIPPED_JOBS not in frame.columns:
        return False
    return bool((pd.to_numeric(frame[SKIPPED_JOBS], errors="coerce") > 0).any())


def runs_table(group: Group) -> list[str]:
    """Markdown lines: the unpruned model, then one row per shown run sorted by the swept settings
    (:func:`~.overview.sweep_axes`), each metric rounded to its precision; where the group has skipped
    jobs, what each run is to it (:func:`job_cell`); the run id last."""
    frame = group.shown
    axes = sweep_axes(frame)
    metrics = [m for m in metric_columns(frame) if m not in IN_UNPRUNED_ROW]
    settings = axes + ([] if "cuts" in axes else ["cuts"])
    jobs = marks_jobs(group)
    headers = [*settings, *metrics, *(["job"] if jobs else []), "run_id"]
    if axes:
        keys = pd.DataFrame({a: sort_keys(frame, a) for a in axes}, index=frame.index)
        frame = frame.loc[keys.sort_values(axes, kind="mergesort").index]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    if any(baseline_cell(frame, m) != MISSING for m in metrics if m not in BASELINE_CONSTANTS):
        cells = ["unpruned"] + [""] * (len(settings) - 1) + [baseline_cell(frame, m) for m in metrics]
        lines.append("| " + " | ".join(cells + [""] * (1 + jobs)) + " |")
    columns = {m: _measure_cells(frame, m) for m in metrics}
    shown = {a: axis_values(frame, a).map(value_label) for a in axes}
    for index, run in frame.iterrows():
        cells = [shown[a][index] if a in shown else _cuts(run.get(a)) for a in settings]
        cells += [marked(columns[m][index], is_energy_metric(m) and any_estimated(run)) for m in metrics]
        cells += [job_cell(run)] if jobs else []
        cells += [str(run["run_id"])]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def sort_keys(frame: pd.DataFrame, axis: str) -> pd.Series:
    """Sortable text of ``axis``' values: numbers by value, the rest by text."""
    values = axis_values(frame, axis)
    if axis != "cuts" and is_numeric(list(values)):
        return values.map(lambda v: f"{float(v):+024.10f}" if v is not None else "~")
    return values.map(lambda v: str(v))


def failed_lines(group: Group) -> list[str]:
    """One bullet per failed run: its run id, what distinguishes its setting, its error."""
    if group.failed.empty:
        return ["No failed runs."]
    varying = varying_settings(pd.concat([group.shown, group.failed]))
    lines = []
    for _, run in group.failed.iterrows():
        setting = ", ".join(f"{c}={_cell(run.get(c))}" for c in varying if c in run.index)
        error = (str(run.get("error") or "no error recorded").splitlines() or [""])[0]
        stage = f" in stage {run['failed_stage']}" if isinstance(run.get("failed_stage"), str) else ""
        lines.append(f"- `{run['run_id']}`{f' ({setting})' if setting else ''}{stage}: {error}")
    return lines


# The overview's figures: (file stem, metrics, title, caption). A metric list with "score_*" /
# "clip" expands to every such column the sweep records (one panel each).
ERROR_NOTE = (
    "Error bars: ±1 standard error (a run's: the one its recorded 95% interval implies, else lm-eval's; "
    "between the runs where several seeds or calibration draws share a point); dashed: the unpruned model."
)
CLIP_PREFIXES_PLOTTED = CLIP_PREFIXES


def score_columns(frame: pd.DataFrame) -> list[str]:
    """The suite's per-task scores (``score_<task>``, the declared metric of each task) the runs record."""
    return sorted(
        c
        for c in frame.columns
        if c.startswith("score_")
        and not c.startswith(("score_stderr_", "score_items_"))
        and pd.to_numeric(frame[c], errors="coerce").notna().any()
    )


def clip_columns(frame: pd.DataFrame) -> list[str]:
    return sorted(
        c
        for c in frame.columns
        if c.startswith(CLIP_PREFIXES) and pd.to_numeric(frame[c], errors="coerce").notna().any()
    )


def overview_figures(frame: pd.DataFrame, folder: Path) -> list[tuple[Path, str]]:
    """Draw the sweep's overview figures into ``folder``; returns (PNG, caption) of each drawn."""
    axes = sweep_axes(frame)
    plans = [
        (
            "ppl_heldout",
            ["ppl_heldout"],
            True,
            "Held-out perplexity (bars: ±1 standard error, the one its 95% bootstrap interval over documents, or "
            "windows for rows before 2026-12-07, implies; between the runs where several share a point).",
        ),
        (
            "avg_acc",
            ["avg_acc"],
            True,
            "Average accuracy over the suite's tasks (bars: ±1 standard error, the one its 95% bootstrap interval "
            "over items implies; between the runs where several share a point).",
        ),
        ("tasks", score_columns(frame) if len(score_columns(frame)) > 1 else [], False, "Each task's score."),
        ("cos_dist", ["cos_dist_after"], True, "Mean cosine distance across each cut on held-out text, with T."),
        ("clip", clip_columns(frame), False, "CLIP benchmarks."),
    ]
    out = []
    for stem, metrics, split, caption in plans:
        panels = [p for metric in metrics for p in metric_panels(frame, metric, axes, split=split or len(metrics) == 1)]
        if not panels:
            continue
        path = folder / f"{stem}.png"
        draw(panels, path, ERROR_NOTE)
        out.append((path, caption))
    return out


def group_markdown(
    group: Group, images: list[tuple[Path, str]], relative_to: Path, show_failed: bool = False, results: str = ""
) -> str:
    """A sweep's page: counts, swept and fixed settings, figures, runs (unpruned first), failures."""
    lines = [f"# {group.title}", "", group.counts() + ".", ""]
    shown = group.shown
    axes = sweep_axes(shown)
    if axes:
        swept = [
            f"{a} ({', '.join(value_label(v) for v in dict.fromkeys(sorted_values(shown, a)))})" for a in axes
        ]
        lines += ["Swept: " + "; ".join(swept) + ".", ""]
    elif not shown.empty:
        lines += ["No setting varies among the finished runs.", ""]
    fixed = fixed_settings(shown if not shown.empty else group.failed)
    if fixed:
        lines += ["Fixed: " + ", ".join(f"{k}={_cell(v)}" for k, v in fixed.items()) + ".", ""]
    if images:
        lines += ["## Figures", ""]
        for path, caption in images:
            lines += [f"![{path.stem}]({path.relative_to(relative_to)})", "", f"*{caption}*", ""]
    lines += [f"## Runs ({len(shown)})", ""]
    lines += runs_table(group) if not shown.empty else ["No finished runs."]
    if not shown.empty:
        lines += ["", LEADERS_NOTE]
    if marks_jobs(group):
        lines += ["", SKIPPED_NOTE]
    lines += ["", *failed_section(group, show_failed, results)]
    return "\n".join(lines) + "\n"


SKIPPED_NOTE = (
    "A job skipped as finished before (its configuration already had a finished row) is shown by that run: "
    "`skipped: run of sweep <id>` for a run of another sweep or an earlier single job; `finished + k skipped` "
    "when another job of this sweep ran its configuration (e.g. an alpha its objective ignores). One line per "
    "configuration: a run is never shown twice."
)


def sorted_values(frame: pd.DataFrame, axis: str) -> list:
    values = list(axis_values(frame, axis))
    numeric = axis != "cuts" and is_numeric(values)
    return sorted(values, key=lambda v: (v is None, v if numeric and v is not None else str(v)))


def failed_section(group: Group, show_failed: bool, results: str = "") -> list[str]:
    """The failed runs: listed with ``show_failed``, else one line counting them."""
    n = len(group.failed)
    if not n:
        return []
    if show_failed:
        return [f"## Failed runs ({n})", "", *failed_lines(group), ""]
    where = f" RESULTS={results}" if results else ""
    return [
        f"{n} failed run{'s' if n != 1 else ''} hidden (`make report{where} SHOW_FAILED=1` lists them, "
        f"`make clean-failed{where}` removes them from the store).",
        "",
    ]


def build_groups(table: pd.DataFrame, skips: pd.DataFrame | None = None) -> list[Group]:
    """One group for all runs, then one per sweep (by ``sweep_id``; rows without one form the
    group ``no_sweep``) with its skipped jobs (``skips``: :meth:`ResultsStore.load_skips`), each shown
    by the run of the store that finished its configuration."""
    skips = skips if skips is not None else pd.DataFrame()
    if table.empty and skips.empty:
        return [Group("all", "All runs", 0, table, table)]
    store_finished = table[_statuses(table) == "finished"] if not table.empty else table
    groups = [split_runs(table, "all", "All runs", skips, store_finished)]

    def sweep_ids(frame: pd.DataFrame) -> pd.Series:
        if "sweep_id" not in frame.columns:
            return pd.Series("no_sweep", index=frame.index, dtype=object)
        return frame["sweep_id"].astype(object).where(frame["sweep_id"].notna(), "no_sweep")

    def names(frame: pd.DataFrame) -> list[str]:
        return [n for n in frame.get("sweep_name", pd.Series(dtype=object)) if isinstance(n, str)]

    sweeps, skip_sweeps = sweep_ids(table), sweep_ids(skips)
    for sweep in sorted(set(sweeps) | set(skip_sweeps), key=str):
        rows, its_skips = table[sweeps == sweep], skips[skip_sweeps == sweep]
        group = split_runs(rows, str(sweep), "", its_skips, store_finished)
        label = sweep_label(names(rows) + names(its_skips), sweep_axes(group.shown))
        group.title = f"{label} (sweep {sweep})" if label else f"Sweep {sweep}"
        groups.append(group)
    return groups


GENERIC_NAMES = ("sweep", "single")


def sweep_label(names: list[str], axes: list[str]) -> str | None:
    """What a sweep compares, for its title: its ``sweep_name`` (``experiment=<a>,<b>``); rows written
    before sweeps were named as a whole name each job's preset (``experiment/<a>``, ``experiment/<b>``):
    joined into ``experiment=<a>,<b>``; a sweep of no
    preset (``sweep``) by its swept settings (``alpha, n_prune``); None when nothing says more."""
    distinct = [n for n in dict.fromkeys(names) if n not in GENERIC_NAMES]
    if len(distinct) == 1:
        return distinct[0]
    groups = {n.partition("/")[0] for n in distinct}
    if len(distinct) > 1 and len(groups) == 1 and all("/" in n for n in distinct):
        return f"{groups.pop()}=" + ",".join(n.partition("/")[2] for n in distinct)
    if distinct:
        return " + ".join(distinct)
    return ", ".join(axes) or None


def write_report(results_dir: str | Path, out_dir: str | Path | None = None, show_failed: bool = False) -> list[str]:
    """Write the report; returns the lines to print (counts per group, then the files)."""
    store = ResultsStore(results_dir)
    table, skips = store.load(), store.load_skips()
    out = Path(out_dir) if out_dir is not None else Path(results_dir) / "report"
    n_files = len(list(store.runs.glob("*/*.parquet"))) if store.runs.is_dir() else 0
    n_skip_files = len(list(store.skips.glob("*/*.parquet"))) if store.skips.is_dir() else 0
    unreadable = n_files + n_skip_files - len(table) - len(skips)
    lines = [f"read {len(table)} rows from {n_files} row files under {store.runs}"]
    if n_skip_files:
        lines[0] += f" and {len(skips)} skipped jobs' rows from {n_skip_files} files under {store.skips}"
    if unreadable > 0:
        lines[0] += f"; {unreadable} unreadable file(s) skipped (named in the warnings above)"
    index = ["# Report", "", lines[0] + ".", ""]
    index += ["| sweep | finished | skipped (finished before) | failed | rows read | not shown | swept |"]
    index.append("|---|---|---|---|---|---|---|")
    hidden = 0
    for group in build_groups(table, skips):
        if group.name == "all":
            markdown, folder = out / "all.md", None
        else:
            markdown, folder = out / "sweeps" / f"{file_name(group.name)}.md", out / "sweeps" / file_name(group.name)
        if group.name != "all" and group.shown.empty and not show_failed:
            hidden += 1
            lines.append(f"{group.title}: {group.counts()} (no finished run: hidden; --show-failed shows it)")
            continue
        images = overview_figures(group.shown, folder) if folder is not None and not group.shown.empty else []
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(group_markdown(group, images, markdown.parent, show_failed, str(results_dir)))
        link = markdown.relative_to(out)
        counts = f"{group.n_finished} | {group.n_skipped} | {len(group.failed)} | {group.n_read} | {group.n_not_shown}"
        swept = ", ".join(sweep_axes(group.shown)) or "—"
        index.append(f"| [{group.title}]({link}) | {counts} | {swept} |")
        lines.append(f"{group.title}: {group.counts()} -> {markdown} ({len(images)} figures)")
    if hidden:
        index += ["", f"{hidden} sweep(s) without a finished run are hidden (--show-failed lists them)."]
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.md").write_text("\n".join(index) + "\n")
    lines.append(f"index: {out / 'index.md'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default=None, help="default: <results>/report")
    parser.add_argument("--show-failed", action="store_true", help="list failed runs and sweeps without a finished run")
    args = parser.parse_args()
    for line in write_report(args.results, args.out, args.show_failed):
        print(line)


if __name__ == "__main__":
    main()
