"""The end of a sweep: one table of its jobs (finished / skipped / failed, each failure's one-line
error) and a non-zero exit when any job failed, after all of them ran.

Each job leaves ``replaceme_status.json`` in its Hydra job directory (:func:`write_job_status`);
the callback reads them from the sweep directory, so it works with every launcher (local, joblib
workers, SLURM nodes sharing the results folder).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from replaceme_exp.results.row import format_cuts
from replaceme_exp.storage import write_json

log = logging.getLogger("replaceme_exp")

STATUS_FILE = "replaceme_status.json"


STATUS_KEYS = (
    "status",
    "error",
    "failed_stage",
    "run_id",
    "config_hash",
    "cuts",
    "ppl_heldout_baseline",
    "ppl_heldout",
    "avg_acc",
    "rp",
    "time_total_s",
)


def write_job_status(job_dir: str | Path, row: dict, overrides: str) -> None:
    """What the sweep summary needs of one job."""
    status = {"overrides": overrides, **{k: row.get(k) for k in STATUS_KEYS}}
    write_json(Path(job_dir) / STATUS_FILE, status)


def read_statuses(sweep_dir: str | Path) -> list[dict]:
    """One status per job directory of the sweep (a folder with Hydra's ``.hydra``): a job that
    left no readable status counts as failed."""

    def job_number(p: Path) -> tuple:
        return (0, int(p.name)) if p.name.isdigit() else (1, str(p))

    job_dirs = sorted({p.parent for p in Path(sweep_dir).rglob(".hydra")}, key=job_number)
    statuses = []
    for job_dir in job_dirs:
        try:
            statuses.append(json.loads((job_dir / STATUS_FILE).read_text()))
        except (OSError, ValueError) as err:
            statuses.append({"overrides": str(job_dir), "status": "failed", "error": f"no job status ({err})"})
    return statuses


def _number(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


def summary_lines(statuses: list[dict], n_jobs: int | None = None) -> list[str]:
    """A count line, then a table of the jobs: status, cuts, held-out ppl before -> after, avg_acc,
    rp, time, and the job's overrides (a failed job: its stage and one-line error instead)."""
    counts = {k: sum(s["status"] == k for s in statuses) for k in ("finished", "skipped", "failed")}
    lines = [
        f"sweep: {counts['finished']} finished, {counts['skipped']} skipped, {counts['failed']} failed"
        + (f", {n_jobs - len(statuses)} left no status" if n_jobs and n_jobs > len(statuses) else "")
    ]
    header = f"  {'status':8s} {'cuts':12s} {'ppl before -> after':>22s} {'avg_acc':>7s} {'rp':>6s} {'time':>7s}  job"
    lines.append(header)
    for s in statuses:
        job = s["overrides"] or "default"
        if s["status"] == "failed":
            where = f" in {s['failed_stage']}" if s.get("failed_stage") else ""
            error = str(s.get("error") or "").splitlines()[0] if s.get("error") else ""
            lines.append(f"  {'failed':8s} {job}: failed{where}: {error}")
            continue
        ppl = f"{_number(s.get('ppl_heldout_baseline'), '.2f')} -> {_number(s.get('ppl_heldout'), '.2f')}"
        time_s = _number(s.get("time_total_s"), ".0f")
        lines.append(
            f"  {s['status']:8s} {format_cuts(s.get('cuts'), '—'):12s} {ppl:>22s} "
            f"{_number(s.get('avg_acc'), '.3f'):>7s} "
            f"{_number(s.get('rp'), '.3f'):>6s} {time_s + ' s' if time_s != '—' else '—':>7s}  {job}"
        )
    return lines


class SweepSummary(Callback):
    """Hydra callback (``hydra.callbacks.sweep_summary``)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        statuses = read_statuses(config.hydra.sweep.dir)
        for line in summary_lines(statuses):
            log.info(line)
        failed = [s for s in statuses if s["status"] == "failed"]
        if failed:
            log.error("%d of %d jobs failed", len(failed), len(statuses))
            sys.exit(1)
