"""One W&B run per job: grouped by sweep, named from the job's overrides, with the resolved
config, every scalar of the row, the solver's loss curves and the distance profile over the
candidate cuts. Offline by default (``tracking.wandb.mode``)."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def scalar_columns(row: dict) -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
            out[key] = value
    return out


def log_job_to_wandb(cfg: DictConfig, row: dict, job_dir: str | os.PathLike, run_name: str | None = None) -> str | None:
    """Log a finished or failed job; returns the run's directory (None when disabled)."""
    settings = cfg.tracking.wandb
    if settings.mode == "disabled":
        return None
    import wandb

    Path(job_dir).mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=settings.project,
        entity=settings.get("entity"),
        group=row.get("sweep_id") or "single",
        name=run_name or row["run_id"],
        job_type="prune",
        tags=list(settings.get("tags") or []),
        dir=str(job_dir),
        mode=settings.mode,
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    try:
        for cut, curve in (row.get("loss_curves") or {}).items():
            for step, value in enumerate(curve):
                run.log({f"train/loss_{cut}": value, "train/step": step})
        profile = row.get("candidate_distances")
        if profile:
            table = wandb.Table(columns=["start", "end", "distance"], data=[list(p) for p in profile])
            run.log(
                {
                    "selection/distance_profile": wandb.plot.line(
                        table, "start", "distance", title="distance by cut start"
                    )
                }
            )
        scalars = scalar_columns(row)
        run.log(scalars)
        run.summary.update({**scalars, "status": row.get("status"), "cuts": str(row.get("cuts"))})
        return run.dir
    finally:
        run.finish()
