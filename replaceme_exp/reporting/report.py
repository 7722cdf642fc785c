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
from replaceme_exp.reporting.ties import LEADERS_NOTE, Cell, mark_column
from replaceme_exp.results.store import ResultsStore, latest_of_each_config, started_text

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
    """The runs of one sweep (or of all sweeps): ``shown`` the finished runs (the latest per
    config hash), ``failed`` the failed ones whose configuration never finished (the latest per
    config hash), ``skipped`` the number of other rows per reason."""

    name: str
    title: str
    n_read: int
    shown: pd.DataFrame
    failed: pd.DataFrame
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def counts(self) -> str:
        reasons = "; ".join(f"{n} {why}" for why, n in self.skipped.items())
        return (
            f"read {self.n_read} rows, showing {len(self.shown)} finished runs, {len(self.failed)} failed, "
            f"{self.n_skipped} skipped" + (f" ({reasons})" if reasons else "")
        )


def split_runs(rows: pd.DataFrame, name: str, title: str) -> Group:
    """Sort the rows of one group into shown, failed and skipped (with the reason of each skip).
    The latest run of a configuration is its latest by ``run_seq`` (``oldest_first``: not by a
    node's clock); the tables list runs by ``started_at``."""
    status = rows["status"] if "status" in rows.columns else pd.Series(None, index=rows.index)
    ordered = rows.assign(_started=started_text(rows)).sort_values("_started", kind="mergesort")
    finished = ordered[status.loc[ordered.index] == "finished"]
    shown = latest_of_each_config(finished)
    skipped: dict[str, int] = {}
    if len(finished) > len(shown):
        skipped["older finished runs of a configuration shown by its latest run"] = len(finished) - len(shown)
    failed_all = ordered[status.loc[ordered.index] == "failed"]
    later_finished = failed_all["config_hash"].isin(set(shown["config_hash"]))
    if int(later_finished.sum()):
        skipped["failed runs of a configuration that also finished"] = int(later_finished.sum())
    failed_only = failed_all[~later_finished]
    failed = latest_of_each_config(failed_only)
    if len(failed_only) > len(failed):
        skipped["older failures of a configuration listed by its latest failure"] = len(failed_only) - len(failed)
    other = ordered[~status.loc[ordered.index].isin(["finished", "failed"])]
    for value, count in other["status"].fillna("none").value_counts().items() if len(other) else []:
        skipped[f"rows with status={value} (unfinished: killed or still running)"] = int(count)
    drop = ["_started"]
    return Group(name, title, len(rows), shown.drop(columns=drop), failed.drop(columns=drop), skipped)


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
    low = pd.to_numeric(frame.get(f"{metric}_ci_low", pd.Series(np.nan, index=frame.index)), errors="coerce")
    high = pd.to_numeric(frame.get(f"{metric}_ci_high", pd.Series(np.nan, index=frame.index)), errors="coerce")
    shown = []
    for index, value, error in zip(frame.index, values, errors):
        interval = np.isfinite(low[index]) and np.isfinite(high[index])
        if interval and (metric.startswith("ppl") or not np.isfinite(error)):
            shown.append(f"{format_number(value)} [{format_number(low[index])}, {format_number(high[index])}]")
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


def runs_table(group: Group) -> list[str]:
    """Markdown lines: the unpruned model, then one row per shown run sorted by the swept settings
    (:func:`~.overview.sweep_axes`), each metric rounded to its precision; the run id last."""
    frame = group.shown
    axes = sweep_axes(frame)
    metrics = [m for m in metric_columns(frame) if m not in IN_UNPRUNED_ROW]
    settings = axes + ([] if "cuts" in axes else ["cuts"])
    headers = [*settings, *metrics, "run_id"]
    if axes:
        keys = pd.DataFrame({a: sort_keys(frame, a) for a in axes}, index=frame.index)
        frame = frame.loc[keys.sort_values(axes, kind="mergesort").index]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    if any(baseline_cell(frame, m) != MISSING for m in metrics if m not in BASELINE_CONSTANTS):
        cells = ["unpruned"] + [""] * (len(settings) - 1) + [baseline_cell(frame, m) for m in metrics] + [""]
        lines.append("| " + " | ".join(cells) + " |")
    columns = {m: _measure_cells(frame, m) for m in metrics}
    shown = {a: axis_values(frame, a).map(value_label) for a in axes}
    for index, run in frame.iterrows():
        cells = [shown[a][index] if a in shown else _cuts(run.get(a)) for a in settings]
        cells += [marked(columns[m][index], is_energy_metric(m) and any_estimated(run)) for m in metrics]
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
    "Error bars: ±1 standard error (lm-eval's for a run; between the runs where several seeds share a point); "
    "dashed: the unpruned model."
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
        ("ppl_heldout", ["ppl_heldout"], True, "Held-out perplexity (bars: its 95% bootstrap interval over windows)."),
        ("avg_acc", ["avg_acc"], True, "Average accuracy over the suite's tasks (its standard error from the tasks')."),
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
    lines += ["", *failed_section(group, show_failed, results)]
    return "\n".join(lines) + "\n"


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

def build_groups(table: pd.DataFrame) -> list[Group]:
    """One group for all runs, then one per sweep (by ``sweep_id``; rows without one form the
    group ``no_sweep``)."""
    if table.empty:
        return [Group("all", "All runs", 0, table, table)]
    groups = [split_runs(table, "all", "All runs")]
    sweeps = table["sweep_id"].fillna("no_sweep") if "sweep_id" in table.columns else pd.Series("no_sweep", table.index)
    names = table["sweep_name"] if "sweep_name" in table.columns else pd.Series(None, index=table.index)
    for sweep in sorted(sweeps.unique(), key=str):
        rows = table[sweeps == sweep]
        group = split_runs(rows, str(sweep), "")
        label = sweep_label([n for n in names[rows.index] if isinstance(n, str)], sweep_axes(group.shown))
        group.title = f"{label} (sweep {sweep})" if label else f"Sweep {sweep}"
        groups.append(group)
    return groups


GENERIC_NAMES = ("sweep", "single")


def sweep_label(names: list[str], axes: list[str]) -> str | None:
    """What a sweep compares, for its title: its ``sweep_name`` (``experiment=replaceme_ls,uidl_baseline``);
    rows written before sweeps were named as a whole name each job's preset (``experiment/replaceme_ls``,
    ``experiment/uidl_baseline``): joined into ``experiment=replaceme_ls,uidl_baseline``; a sweep of no
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
    table = store.load()
    out = Path(out_dir) if out_dir is not None else Path(results_dir) / "report"
    n_files = len(list(store.runs.glob("*/*.parquet"))) if store.runs.is_dir() else 0
    unreadable = n_files - len(table)
    lines = [f"read {len(table)} rows from {n_files} row files under {store.runs}"]
    if unreadable > 0:
        lines[0] += f"; {unreadable} unreadable file(s) skipped (named in the warnings above)"
    index = ["# Report", "", lines[0] + ".", "", "| sweep | read | finished shown | failed | skipped | swept |"]
    index.append("|---|---|---|---|---|---|")
    hidden = 0
    for group in build_groups(table):
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
        counts = f"{group.n_read} | {len(group.shown)} | {len(group.failed)} | {group.n_skipped}"
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
