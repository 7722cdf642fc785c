"""One W&B run per job, started when the job starts: it holds the resolved config with the job's
``run_id``, ``config_hash`` and ``setting_hash`` from the first second, logs each stage as it ends
and progress as it goes, and at the end every scalar of the row, the solvers' loss curves, the
distance profile over the candidate cuts and the status (a failed job finishes its run as failed;
a job killed outright leaves an offline run that syncs as crashed). Grouped by sweep (the
template's name for ``+paper=`` sweeps). Offline by default (``tracking.wandb.mode``), and quiet:
no banner, no summary sparklines in the job's log.

Sync a whole offline sweep: ``make wandb-sync SWEEP=<sweep or results dir>``.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from replaceme_exp.config.schema import WandbConfig

log = logging.getLogger(__name__)

# What the run carries from its first second (config) and in its summary (with every scalar).
IDENTITY_KEYS = ("run_id", "config_hash", "setting_hash", "sweep_id", "sweep_name", "git_sha")
SUMMARY_TEXT_KEYS = ("status", "error", "cuts", "pruned_model_path", "row_path", "device")


def scalar_columns(row: dict) -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
            out[key] = value
    return out


def run_tags(settings: WandbConfig, row: dict) -> list[str]:
    """The configured tags, the sweep's name and the job's model, objective, calibration and eval."""
    tags = [str(t) for t in (settings.tags or [])]
    if row.get("sweep_name"):
        tags.append(str(row["sweep_name"]))
    tags += [f"{k}:{row[k]}" for k in ("model", "objective", "calibration", "eval") if row.get(k)]
    return list(dict.fromkeys(t[:64] for t in tags))  # W&B caps a tag at 64 characters


class WandbRun:
    """The job's W&B run (a no-op when ``tracking.wandb.mode=disabled``), recording ``config``.

    ``start`` opens it, ``stage`` logs a finished stage, ``progress`` a loop's progress, ``finish``
    closes it with the row; ``directory`` is the run's offline folder (None when disabled)."""

    def __init__(
        self, settings: WandbConfig, config: dict, row: dict, job_dir: str | os.PathLike, run_name: str | None = None
    ):
        self.config = config  # the job's configuration as W&B records it
        self.settings = settings
        self.row = row
        self.job_dir = Path(job_dir)
        self.run_name = run_name
        self.run = None
        self.directory: str | None = None
        self._step = 0

    @property
    def enabled(self) -> bool:
        return self.settings.mode != "disabled"

    def start(self) -> None:
        if not self.enabled:
            return
        import wandb

        self.job_dir.mkdir(parents=True, exist_ok=True)
        config = dict(self.config)
        config.update({k: self.row.get(k) for k in IDENTITY_KEYS})
        self.run = wandb.init(
            project=self.settings.project,
            entity=self.settings.entity,
            group=self.settings.group or self.row.get("sweep_group") or "single",
            name=self.run_name or self.row["run_id"],
            job_type="prune",
            tags=run_tags(self.settings, self.row),
            dir=str(self.job_dir),
            mode=self.settings.mode,
            config=config,
            settings=wandb.Settings(silent=True, quiet=True, console="off", show_info=False),
        )
        self.directory = self.run.dir and str(Path(self.run.dir).parent)
        self.run.summary.update({"status": "running", **{k: self.row.get(k) for k in IDENTITY_KEYS}})

    def stage(self, name: str, seconds: float) -> None:
        """A stage ended after ``seconds`` (logged as ``stage/<name>_s``)."""
        if self.run is not None:
            self._step += 1
            self.run.log({f"stage/{name.replace(' ', '_')}_s": seconds, "stage/index": self._step})

    def progress(self, desc: str, done: int, total: int | None) -> None:
        """A loop's progress (``progress/<desc>``: the fraction done, or the count without a total)."""
        if self.run is not None:
            value = done / total if total else done
            self.run.log({f"progress/{desc.replace(' ', '_')}": value})

    def finish(self, row: dict) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            import wandb

            for cut, curve in (row.get("loss_curves") or {}).items():
                for step, value in enumerate(curve):
                    run.log({f"train/loss_{cut}": value, "train/step": step})
            profile = row.get("candidate_distances")
            if profile:
                table = wandb.Table(columns=["start", "end", "distance"], data=[list(p) for p in profile])
                plot = wandb.plot.line(table, "start", "distance", title="distance by cut start")
                run.log({"selection/distance_profile": plot})
            scalars = scalar_columns(row)
            run.log(scalars)
            text = {k: str(row.get(k)) if row.get(k) is not None else None for k in SUMMARY_TEXT_KEYS}
            run.summary.update({**scalars, **text})
        finally:
            run.finish(exit_code=0 if row.get("status") == "finished" else 1)
