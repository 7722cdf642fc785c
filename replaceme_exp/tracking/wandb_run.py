"""One W&B run per job, started when the job starts, logging what the job measures as it is
measured.

The run holds the resolved config with the job's ``run_id``, ``config_hash`` and ``setting_hash``
and its row's settings (``setting.<column>``, e.g. ``setting.alpha``) from the first second. Then,
at the step it happens (every ``wandb.log`` is one step, and each carries ``job/elapsed_s``, the
seconds since the run started, as a time axis):

- each stage's wall time and energy as the stage ends (``stage/<label>_s``, ``stage/<label>_kwh``);
- progress of long loops (``progress/<loop>``: the fraction done, or the count without a total);
- every number the job records in its row, when it is recorded (``ppl_heldout_baseline`` after
  the baseline evaluation, ``cos_dist_after`` after the held-out distances, ``ppl_heldout``, ...,
  under their row column names), the solvers' loss curves (``train/loss_<cut>`` against
  ``train/step``) and the distance profile over the candidate cuts;
- text samples as ``wandb.Table``: the model's own calibration answers when it made them
  (``samples/calibration_generated``: prompt, answer) and the eval generation samples
  (``samples/generation``: prompt, unpruned, pruned; or prompt, answer).

At the end the summary holds every scalar of the row and the status (a failed job finishes its run
as failed; a job killed outright leaves an offline run that syncs as crashed). Grouped by sweep
(the row's ``sweep_group``: one group per sweep whatever it sweeps). Offline by default
(``tracking.wandb.mode``), and quiet: no banner, no summary sparklines in the job's log.

Sync a whole offline sweep: ``make wandb-sync SWEEP=<sweep or results dir>``; read an offline run
without a server: :mod:`replaceme_exp.tracking.wandb_offline`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from replaceme_exp.config.schema import WandbConfig

log = logging.getLogger(__name__)

# What the run carries from its first second (config) and in its summary (with every scalar).
IDENTITY_KEYS = ("run_id", "config_hash", "setting_hash", "sweep_id", "sweep_name", "git_sha")
SUMMARY_TEXT_KEYS = ("status", "error", "cuts", "pruned_model_path", "row_path", "device")
# Row columns logged as tables or curves, not as scalars.
GENERATION_SAMPLES = "generation_samples"
# Columns of a starting row that are no setting (the rest go to the config's ``setting`` block).
NOT_SETTINGS = ("status", "error", "started_at", "run_seq", "sweep_group", "cached_stages", "pruned_model_path")


def setting_config(row: dict) -> dict:
    """The job's row settings (model, objective, alpha, n_prune, ...) as the row names them: the
    config's ``setting`` block, so a workspace filters and groups runs by ``setting.<column>``
    whatever config path set it. Lists (explicit cuts) as JSON text."""
    out = {}
    for key, value in row.items():
        if key in IDENTITY_KEYS or key in NOT_SETTINGS or key.endswith("_version") or value is None:
            continue
        if isinstance(value, (list, tuple, dict)):
            value = json.dumps(value)
        if isinstance(value, (str, int, float, bool)):
            out[key] = value
    return out


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


def samples_table(value) -> tuple[list[str], list[list]] | None:
    """The ``generation_samples`` cell (a list of dicts, or its JSON text) as (columns, rows)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, list) or not value or not isinstance(value[0], dict):
        return None
    columns = list(value[0])
    return columns, [[str(sample.get(c, "")) for c in columns] for sample in value]


class WandbRun:
    """The job's W&B run (a no-op when ``tracking.wandb.mode=disabled``), recording ``config``.

    ``start`` opens it in a background thread (importing wandb and starting its service take about
    a second that the job's first stage need not wait for); :meth:`ready` waits for it. While the
    job runs, ``stage`` (a stage ended), ``progress`` (a loop's progress), ``samples`` (a published
    table, :mod:`replaceme_exp.samples`) and ``stage_starts`` (a stage observer,
    :func:`replaceme_exp.stages.observed_by`) log what the row gained since the last log (the
    observer and ``progress`` skip it while the run is opening); ``finish`` closes it with the row.
    ``row`` is the job's row, filled in place as the job runs (``wandb_dir``: the run's offline
    folder, once open). ``directory`` is that folder (None when disabled or not open yet)."""

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
        self._opening: threading.Thread | None = None
        self._open_error: BaseException | None = None
        self._started = time.monotonic()
        self._settings_keys: set[str] = set()  # the row's columns set at start: settings, not measurements
        self._logged: dict = {}  # what has been logged of each row column

    @property
    def enabled(self) -> bool:
        return self.settings.mode != "disabled"

    def start(self, wait: bool = False) -> None:
        """Open the run in a background thread (``wait``: in this one), with the config and
        settings of the row as it is now."""
        if not self.enabled:
            return
        self.job_dir.mkdir(parents=True, exist_ok=True)
        config = dict(self.config)
        config.update({k: self.row.get(k) for k in IDENTITY_KEYS}, setting=setting_config(self.row))
        init = dict(
            project=self.settings.project,
            entity=self.settings.entity,
            group=self.settings.group or self.row.get("sweep_group") or "single",
            name=self.run_name or self.row["run_id"],
            job_type="prune",
            tags=run_tags(self.settings, self.row),
            dir=str(self.job_dir),
            mode=self.settings.mode,
            config=config,
        )
        self._settings_keys = {k for k, v in self.row.items() if v is not None}
        summary = {"status": "running", **{k: self.row.get(k) for k in IDENTITY_KEYS}}
        self._opening = threading.Thread(target=self._open, args=(init, summary), name="wandb-start", daemon=True)
        self._opening.start()
        if wait:
            self.ready()

    def _open(self, init: dict, summary: dict) -> None:
        try:
            import wandb

            settings = wandb.Settings(silent=True, quiet=True, console="off", show_info=False)
            run = wandb.init(**init, settings=settings)
            self._started = time.monotonic()
            self.directory = run.dir and str(Path(run.dir).parent)
            run.summary.update(summary)
            self.run = run
        except BaseException as err:  # noqa: BLE001 - said where the job waits for the run (ready)
            self._open_error = err

    def ready(self, wait: bool = True) -> bool:
        """Whether the run is open, waiting for its start unless ``wait`` is false; a start that
        failed is said once (a warning: tracking must not cost the job) and leaves no run."""
        opening = self._opening
        if opening is None or (not wait and opening.is_alive()):
            return self.run is not None
        opening.join()
        self._opening = None
        if self._open_error is not None:
            log.warning("W&B run not started: %s", self._open_error)
            self._open_error = None
        if self.directory is not None:
            self.row["wandb_dir"] = self.directory
        return self.run is not None

    def _log(self, data: dict) -> None:
        self.run.log({**data, "job/elapsed_s": time.monotonic() - self._started})

    def log_new_columns(self) -> None:
        """Log what the row gained or changed since the last call: its numbers (one step), its
        loss curves, distance profile and generation samples (nothing while the run is opening:
        the next call logs it)."""
        if not self.ready(wait=False):
            return
        row, settings = self.row, self._settings_keys
        fresh = {k: v for k, v in scalar_columns(row).items() if k not in settings and self._logged.get(k) != v}
        curves = row.get("loss_curves") or {}
        for cut in [c for c in curves if ("loss_curves", c) not in self._logged]:
            self._logged["loss_curves", cut] = True
            for step, value in enumerate(curves[cut]):
                self._log({f"train/loss_{cut}": value, "train/step": step})
        for key in ("candidate_distances", GENERATION_SAMPLES):
            if row.get(key) is not None and self._logged.get(key) != row.get(key):
                self._logged[key] = row[key]
                getattr(self, f"_log_{key}")(row[key])
        if fresh:
            self._logged.update(fresh)
            self._log(fresh)

    def _log_candidate_distances(self, profile) -> None:
        import wandb

        if profile:
            table = wandb.Table(columns=["start", "end", "distance"], data=[list(p) for p in profile])
            plot = wandb.plot.line(table, "start", "distance", title="distance by cut start")
            self._log({"selection/distance_profile": plot})

    def _log_generation_samples(self, value) -> None:
        if (table := samples_table(value)) is not None:
            self.samples("generation", *table)

    @contextmanager
    def stage_starts(self, kind: str, label: str) -> Iterator[None]:
        """A stage observer: as a stage starts, log what the row gained since the last log."""
        self.log_new_columns()
        yield

    def stage(self, name: str, seconds: float, energy_kwh: float | None = None) -> None:
        """A stage ended after ``seconds`` (``stage/<name>_s``; its energy ``stage/<name>_kwh``)."""
        if self.ready():
            key = f"stage/{name.replace(' ', '_')}"
            data = {f"{key}_s": seconds}
            if energy_kwh is not None:
                data[f"{key}_kwh"] = energy_kwh
            self._log(data)
            self.log_new_columns()

    def progress(self, desc: str, done: int, total: int | None) -> None:
        """A loop's progress (``progress/<desc>``: the fraction done, or the count without a total;
        none while the run is opening)."""
        if self.ready(wait=False):
            value = done / total if total else done
            self._log({f"progress/{desc.replace(' ', '_')}": value})

    def samples(self, name: str, columns: list[str], rows: list[list]) -> None:
        """A table of text samples (``samples/<name>``)."""
        if self.ready():
            import wandb

            self._log({f"samples/{name}": wandb.Table(columns=columns, data=rows)})

    def finish(self, row: dict) -> None:
        if not self.ready():
            return
        self.row = row
        try:
            self.log_new_columns()
        finally:
            run, self.run = self.run, None
        try:
            scalars = scalar_columns(row)
            text = {k: str(row.get(k)) if row.get(k) is not None else None for k in SUMMARY_TEXT_KEYS}
            run.summary.update({**scalars, **text})
        finally:
            run.finish(exit_code=0 if row.get("status") == "finished" else 1)
