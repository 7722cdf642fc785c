"""Reports for any results store: ``make report`` (``RESULTS=dir``, default ``results``).

Writes under ``<results>/report/``: ``index.md`` (every group with its counts), ``all.md`` (all
runs together) and ``sweeps/<sweep_id>.md`` (one per sweep), each with the settings fixed in the
group, a table of its finished runs (the settings that vary, then cuts, perplexity before and
after, accuracies, rp, distances, times, energy), its failed runs with their errors, and figures
(``<group>/<metric>__vs__<setting>.png``) of each key metric against each swept setting. Every
group says how many rows it read, showed and skipped, and why. Unlike the paper's tables nothing
is averaged: one line per run, and a missing number stays ``—``.

    python -m replaceme_exp.reporting.report --results results [--out results/report]
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
from replaceme_exp.reporting.paths import file_name
from replaceme_exp.results.store import ResultsStore, latest_of_each_config, started_text


def _pyplot():
    """matplotlib's pyplot (Agg backend), imported when the first figure is drawn: the tables, and
    whatever imports this module, do without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
# Metrics drawn against each swept setting, where recorded.
PLOTTED_METRICS = ("ppl_heldout", "avg_acc", "rp", "cos_dist_after", "time_total_s", "energy_kwh")
MAX_SERIES = 8


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
    """The key metrics ``frame`` records (at least one number), table order; then accuracies."""
    def recorded(c: str) -> bool:
        return c in frame.columns and pd.to_numeric(frame[c], errors="coerce").notna().any()

    accuracy = sorted(c for c in frame.columns if c.startswith(ACCURACY_PREFIXES) and "stderr" not in c)
    clip = sorted(c for c in frame.columns if c.startswith(CLIP_PREFIXES))
    return [c for c in TABLE_METRICS if recorded(c)] + [c for c in accuracy + clip if recorded(c)]


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


def runs_table(group: Group) -> list[str]:
    """Markdown lines: one row per shown run, sorted by the varying settings."""
    frame = group.shown
    varying = varying_settings(frame)
    metrics = metric_columns(frame)
    headers = ["run_id", *varying, "cuts", *metrics]
    if varying:
        order = frame[varying].map(lambda v: json.dumps(_plain(v), default=str))
        frame = frame.loc[order.sort_values(varying, kind="mergesort").index]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for _, run in frame.iterrows():
        cells = [str(run["run_id"])] + [_cell(run.get(c)) for c in varying] + [_cuts(run.get("cuts"))]
        cells += [marked(_cell(run.get(c)), is_energy_metric(c) and any_estimated(run)) for c in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


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


def _series_key(frame: pd.DataFrame, others: list[str]) -> pd.Series:
    if not others:
        return pd.Series("all runs", index=frame.index)
    return frame[others].apply(lambda r: ", ".join(f"{c}={_cell(r[c])}" for c in others), axis=1)


def draw_metric(frame: pd.DataFrame, setting: str, metric: str, others: list[str], path: Path) -> str:
    """One PNG of ``metric`` against ``setting``: every run a point, the mean per value a line,
    one series per combination of the ``others`` settings (up to :data:`MAX_SERIES`); a footnote
    says how many runs lack the metric. Returns that footnote ("" when none lack it)."""
    ys = pd.to_numeric(frame[metric], errors="coerce")
    xs_raw = frame[setting].map(_plain)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs_raw.dropna())
    if numeric:
        xs = pd.to_numeric(xs_raw, errors="coerce")
        ticks = None
    else:
        labels = sorted({_cell(v) for v in xs_raw}, key=str)
        xs = xs_raw.map(lambda v: labels.index(_cell(v))).astype(float)
        ticks = labels
    series = _series_key(frame, others)
    if series.nunique() > MAX_SERIES:
        series = pd.Series(f"all runs ({series.nunique()} settings)", index=frame.index)
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.0))
    for name in sorted(series.unique()):
        mask = (series == name) & ys.notna() & xs.notna()
        if not mask.any():
            continue
        points = pd.DataFrame({"x": xs[mask], "y": ys[mask]})
        scatter = ax.scatter(points["x"], points["y"], s=18, alpha=0.6)
        mean = points.groupby("x")["y"].mean().sort_index()
        ax.plot(mean.index, mean.values, marker="o", color=scatter.get_facecolor()[0], label=name)
    if ticks is not None:
        ax.set_xticks(range(len(ticks)), ticks, rotation=20, ha="right", fontsize="small")
    ax.set(xlabel=setting, ylabel=metric, title=f"{metric} vs. {setting}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0] and (len(series.unique()) > 1 or others):
        ax.legend(fontsize="x-small")
    lacking = int(ys.isna().sum())
    footnote = f"{lacking} of {len(frame)} runs record no {metric} (not plotted)" if lacking else ""
    if footnote:
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        fig.text(0.5, 0.01, footnote, ha="center", va="bottom", fontsize="x-small", color="dimgray")
    else:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return footnote


def figures(group: Group, folder: Path) -> list[tuple[Path, str]]:
    """(PNG, footnote) for each plotted metric the group records against each swept setting."""
    frame = group.shown
    varying = [c for c in varying_settings(frame) if c != "seed"]
    out = []
    for setting in varying:
        others = [c for c in varying if c != setting]
        for metric in PLOTTED_METRICS:
            if metric in frame.columns and pd.to_numeric(frame[metric], errors="coerce").notna().any():
                path = folder / f"{file_name(f'{metric}__vs__{setting}')}.png"
                out.append((path, draw_metric(frame, setting, metric, others, path)))
    return out


def group_markdown(group: Group, images: list[tuple[Path, str]], relative_to: Path) -> str:
    lines = [f"# {group.title}", "", group.counts() + ".", ""]
    fixed = fixed_settings(pd.concat([group.shown, group.failed]) if not group.failed.empty else group.shown)
    if fixed:
        lines += ["Fixed settings: " + ", ".join(f"{k}={_cell(v)}" for k, v in fixed.items()) + ".", ""]
    lines += [f"## Finished runs ({len(group.shown)})", ""]
    lines += runs_table(group) if not group.shown.empty else ["No finished runs."]
    lines += ["", f"## Failed runs ({len(group.failed)})", "", *failed_lines(group), "", "## Figures", ""]
    if not images:
        lines.append("No figure: no setting varies among the finished runs." if not group.shown.empty else "No figure.")
    for path, footnote in images:
        rel = path.relative_to(relative_to)
        lines.append(f"![{path.stem}]({rel})" + (f"  \n*{footnote}*" if footnote else ""))
    return "\n".join(lines) + "\n"


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
        label = next((str(n) for n in names[rows.index] if isinstance(n, str)), None)
        title = f"Sweep {sweep}" + (f" ({label})" if label else "")
        groups.append(split_runs(rows, str(sweep), title))
    return groups


def write_report(results_dir: str | Path, out_dir: str | Path | None = None) -> list[str]:
    """Write the report; returns the lines to print (counts per group, then the files)."""
    store = ResultsStore(results_dir)
    table = store.load()
    out = Path(out_dir) if out_dir is not None else Path(results_dir) / "report"
    n_files = len(list(store.runs.glob("*/*.parquet"))) if store.runs.is_dir() else 0
    unreadable = n_files - len(table)
    lines = [f"read {len(table)} rows from {n_files} row files under {store.runs}"]
    if unreadable > 0:
        lines[0] += f"; {unreadable} unreadable file(s) skipped (named in the warnings above)"
    index = ["# Report", "", lines[0] + ".", "", "| group | read | finished shown | failed | skipped |"]
    index.append("|---|---|---|---|---|")
    for group in build_groups(table):
        if group.name == "all":
            markdown, folder = out / "all.md", out / "all"
        else:
            markdown, folder = out / "sweeps" / f"{file_name(group.name)}.md", out / "sweeps" / file_name(group.name)
        images = figures(group, folder) if not group.shown.empty else []
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(group_markdown(group, images, markdown.parent))
        link = markdown.relative_to(out)
        counts = f"{group.n_read} | {len(group.shown)} | {len(group.failed)} | {group.n_skipped}"
        index.append(f"| [{group.title}]({link}) | {counts} |")
        lines.append(f"{group.title}: {group.counts()} -> {markdown} ({len(images)} figures)")
    (out / "index.md").write_text("\n".join(index) + "\n")
    lines.append(f"index: {out / 'index.md'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default=None, help="default: <results>/report")
    args = parser.parse_args()
    for line in write_report(args.results, args.out):
        print(line)


if __name__ == "__main__":
    main()
