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

log = logging.getLogger("replaceme_exp")

STATUS_FILE = "replaceme_status.json"


def write_job_status(job_dir: str | Path, row: dict, overrides: str) -> None:
    """What the sweep summary needs of one job."""
    status = {
        "overrides": overrides,
        "status": row.get("status"),
        "error": row.get("error"),
        "run_id": row.get("run_id"),
        "config_hash": row.get("config_hash"),
        "cuts": row.get("cuts"),
        "ppl_heldout": row.get("ppl_heldout"),
    }
    path = Path(job_dir) / STATUS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{STATUS_FILE}.tmp")
    tmp.write_text(json.dumps(status, default=str))
    tmp.replace(path)


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


def summary_lines(statuses: list[dict], n_jobs: int | None = None) -> list[str]:
    counts = {k: sum(s["status"] == k for s in statuses) for k in ("finished", "skipped", "failed")}
    lines = [
        f"sweep: {counts['finished']} finished, {counts['skipped']} skipped, {counts['failed']} failed"
        + (f", {n_jobs - len(statuses)} left no status" if n_jobs and n_jobs > len(statuses) else "")
    ]
    for s in statuses:
        ppl = f" ppl_heldout={s['ppl_heldout']:.3f}" if isinstance(s.get("ppl_heldout"), (int, float)) else ""
        detail = f" {s['error']}" if s["status"] == "failed" else f" cuts={s.get('cuts')}{ppl}"
        lines.append(f"  {s['status']:8s} {s['overrides'] or 'default'}:{detail}")
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
