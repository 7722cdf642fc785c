"""A W&B workspace (a saved view of the project) for one sweep: ``make wandb-dashboard SWEEP=<sweep>``.

Built with W&B's own Report and Workspace API (``wandb-workspaces``) from the sweep's rows in the
results store: its runs are the W&B runs of the sweep's group (``sweep_group``: one per sweep
whatever it sweeps), grouped by the settings the sweep varies (``setting.<column>`` of each run's
config), with sections

- *Quality*: held-out perplexity (pruned and unpruned), avg_acc, rp, cosine distance and the
  compression, each against every swept setting (a scatter per pair) and across the sweep (a
  parallel-coordinates plot of the swept settings and the metrics);
- *As it ran*: every stage's time and energy as each stage ended, the progress of long loops
  against the job's elapsed seconds, and the solvers' loss curves;
- *Cost*: time and energy per run;
- *Samples*: the model's own calibration answers and the eval generation samples (tables).

Saving needs the W&B server: without one the command says so in one line and exits 1;
``--dry-run`` builds the workspace and prints what it holds without saving.

    python -m replaceme_exp.reporting.wandb_dashboard --results results --sweep <sweep_id or dir> [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

from replaceme_exp.reporting.cells import SETTING_COLUMNS
from replaceme_exp.results.store import ResultsStore
from replaceme_exp.tracking.wandb_sync import server_url, unreachable

QUALITY = ("ppl_heldout", "ppl_heldout_baseline", "avg_acc", "avg_acc_baseline", "rp", "cos_dist_after",
           "compression_ratio")  # fmt: skip
COST = ("time_total_s", "time_capture_s", "time_estimate_s", "time_eval_s", "energy_kwh", "co2_kg")
SAMPLE_TABLES = ("samples/calibration_generated", "samples/generation")
DEFAULT_PROJECT = "replaceme-exp"


def sweep_rows(results_dir: str | Path, sweep: str) -> pd.DataFrame:
    """The rows of ``sweep``'s runs (a sweep id, or a sweep folder whose name is one): the W&B runs of
    its group. Its skipped jobs ran nothing and have no W&B run (:func:`skipped_note`)."""
    table = ResultsStore(results_dir).load()
    sweep_id = Path(sweep).name
    if table.empty or "sweep_id" not in table.columns or not (table["sweep_id"] == sweep_id).any():
        if note := skipped_note(results_dir, sweep_id):
            raise SystemExit(f"SWEEP={sweep}: no run of its own to show: {note}")
        known = sorted(set(table["sweep_id"].dropna())) if "sweep_id" in table.columns else []
        hint = f"; sweeps there: {', '.join(known[-5:])}" if known else ""
        raise SystemExit(f"SWEEP={sweep}: no rows of sweep {sweep_id!r} under {Path(results_dir) / 'runs'}{hint}")
    return table[table["sweep_id"] == sweep_id]


def skipped_note(results_dir: str | Path, sweep_id: str) -> str | None:
    """``2 jobs of the sweep were skipped as finished before: their W&B runs are in the groups of
    sweeps <ids>`` (from the skipped jobs' rows: the runs they stand for); None without one."""
    store = ResultsStore(results_dir)
    skips = store.load_skips()
    if skips.empty or "sweep_id" not in skips.columns or not (skips["sweep_id"] == sweep_id).any():
        return None
    mine = skips[skips["sweep_id"] == sweep_id]
    runs = store.load()
    origin = runs[runs["run_id"].isin(set(mine["finished_run_id"]))] if "run_id" in runs.columns else runs
    groups = sorted({str(g) for g in origin.get("sweep_id", pd.Series(dtype=object)).dropna()})
    where = f"the groups of sweeps {', '.join(groups)}" if groups else "earlier sweeps"
    return f"{len(mine)} job(s) of the sweep were skipped as finished before (no W&B run): their runs are in {where}"


def swept_settings(rows: pd.DataFrame) -> list[str]:
    """The setting columns (and the seed) with more than one value among ``rows``."""
    candidates = [c for c in (*SETTING_COLUMNS, "seed") if not c.endswith("_version") and c != "model_fingerprint"]
    return [
        c
        for c in candidates
        if c in rows.columns and len({json.dumps(v, default=str) for v in rows[c].where(rows[c].notna(), None)}) > 1
    ]


def recorded(rows: pd.DataFrame, metrics: tuple[str, ...]) -> list[str]:
    """The ``metrics`` at least one row records a number of (all of them when none does: the
    workspace then waits for runs that will)."""
    found = [m for m in metrics if m in rows.columns and pd.to_numeric(rows[m], errors="coerce").notna().any()]
    return found or list(metrics)


def sweep_group(rows: pd.DataFrame) -> str:
    """The W&B group of the sweep's runs (the rows' ``sweep_group``, else their sweep id)."""
    groups = rows["sweep_group"].dropna().unique() if "sweep_group" in rows.columns else []
    return str(groups[0]) if len(groups) else str(rows["sweep_id"].iloc[0])


def build_workspace(rows: pd.DataFrame, entity: str, project: str, group: str | None = None):
    """The workspace of the sweep whose rows are ``rows`` (not saved)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    group = group or sweep_group(rows)
    finished = rows[rows["status"] == "finished"] if "status" in rows.columns else rows
    swept = swept_settings(finished if len(finished) else rows)  # a refused run's missing values are no axis
    quality, cost = recorded(rows, QUALITY), recorded(rows, COST)
    settings = [f"setting.{c}" for c in swept]
    scatters = [
        wr.ScatterPlot(title=f"{metric} vs {setting}", x=wr.Config(f"setting.{setting}"), y=wr.SummaryMetric(metric))
        for metric in quality
        if not metric.endswith("_baseline")  # the unpruned model's: a column of the parallel plot
        for setting in swept
    ]
    parallel = wr.ParallelCoordinatesPlot(
        title="the sweep: settings -> metrics",
        columns=[wr.ParallelCoordinatesPlotColumn(metric=wr.Config(s)) for s in settings]
        + [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(m)) for m in quality],
    )
    sections = [
        ws.Section(name="Quality", is_open=True, panels=[parallel, *scatters]
                   + [wr.BarPlot(title=m, metrics=[m]) for m in quality]),  # fmt: skip
        ws.Section(
            name="As it ran",
            is_open=True,
            panels=[
                wr.LinePlot(title="stage times (s)", x="job/elapsed_s", metric_regex="^stage/.*_s$"),
                wr.LinePlot(title="stage energy (kWh)", x="job/elapsed_s", metric_regex="^stage/.*_kwh$"),
                wr.LinePlot(title="progress of long loops", x="job/elapsed_s", metric_regex="^progress/.*"),
                wr.LinePlot(title="solver loss", x="train/step", metric_regex="^train/loss_.*"),
            ],
        ),
        ws.Section(name="Cost", is_open=False, panels=[wr.BarPlot(title=m, metrics=[m]) for m in cost]),
        ws.Section(
            name="Samples",
            is_open=False,
            panels=[wr.WeavePanelSummaryTable(table_name=t, layout=wr.Layout(w=24, h=12)) for t in SAMPLE_TABLES],
        ),
    ]
    return ws.Workspace(
        name=f"ReplaceMe sweep {group}"[:128],
        entity=entity,
        project=project,
        sections=sections,
        runset_settings=ws.RunsetSettings(
            filters=[expr.Metric("Group") == group],
            groupby=[expr.Config(s) for s in settings],
            pinned_columns=[f"config:{s}" for s in settings] + [f"summary:{m}" for m in quality],
        ),
    )


def describe(workspace) -> list[str]:
    """What the workspace holds, a line per section (what ``--dry-run`` prints)."""
    lines = [
        f"workspace {workspace.name!r} of {workspace.entity or '<entity>'}/{workspace.project}",
        f"  runs: {workspace.runset_settings.filters}"
        + (f", grouped by {', '.join(g.name for g in workspace.runset_settings.groupby)}"
           if workspace.runset_settings.groupby else ""),  # fmt: skip
    ]
    for section in workspace.sections:
        titles = [getattr(p, "title", None) or getattr(p, "table_name", type(p).__name__) for p in section.panels]
        lines.append(f"  {section.name}: {len(titles)} panels ({'; '.join(titles)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--sweep", required=True, help="a sweep id (results/hydra/multirun/<id>) or its folder")
    parser.add_argument("--entity", default=os.environ.get("WANDB_ENTITY", ""), help="default: WANDB_ENTITY")
    parser.add_argument("--project", default=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT))
    parser.add_argument("--group", default=None, help="the W&B group (default: the sweep's, from its rows)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the W&B server")
    parser.add_argument("--dry-run", action="store_true", help="build and describe the workspace, do not save it")
    args = parser.parse_args(argv)
    workspace = build_workspace(sweep_rows(args.results, args.sweep), args.entity, args.project, args.group)
    for line in describe(workspace):
        print(line)
    if note := skipped_note(args.results, Path(args.sweep).name):
        print(f"  {note}")
    if args.dry_run:
        return 0
    if not args.entity:
        print("no W&B entity: give ENTITY=<team or user> (or set WANDB_ENTITY); the workspace was not saved",
              file=sys.stderr)  # fmt: skip
        return 1
    url = server_url()
    if why := unreachable(url, args.timeout):
        print(f"could not reach the W&B server at {url} in {args.timeout:g} s ({why}); the workspace was not saved",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        workspace.save()
    except Exception as err:  # noqa: BLE001 - one line: the server's refusal (no key, no project, ...)
        print(f"the workspace was not saved: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"saved: {workspace.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
