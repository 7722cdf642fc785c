"""A job as the command line runs it: always a row.

:func:`run_recorded` checks the configuration (one failed row naming key, value and reason; no
model is loaded for a bad value), skips a configuration that already has a finished row (unless
forced; the skipped job writes a small row of its own under ``skips/``, pointing at that finished
row, and opens no W&B run and no CodeCarbon tracker), reads what a job that runs will read (its
files' contents, the hub datasets it needs) before its model loads, runs identical jobs one at a
time, opens the job's W&B run when the job starts, and writes a ``finished`` or ``failed`` row
(with its error and the stage that failed). A failed job does not stop a sweep; a stop signal
does, after its row.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from pathlib import Path

from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.capture import distributed
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.errors import ConfigError
from replaceme_exp.models.fingerprint import weights_fingerprint
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline import JobSpec, run_job
from replaceme_exp.pipeline.modality import JobPaths
from replaceme_exp.pipeline.rules import (
    check_given_together,
    check_shape,
    overridden_keys,
    results_subfolders,
    writable_directory,
)
from replaceme_exp.progress import configure_from, progress_listener, quiet_library_bars
from replaceme_exp.results import ResultsStore
from replaceme_exp.results.row import refused_row, skip_row, start_row
from replaceme_exp.runtime.locks import config_lock
from replaceme_exp.runtime.log_files import FILE_ONLY, console_skips_file_only, log_files
from replaceme_exp.runtime.signals import JobInterrupted, stop_signals_deferred, stop_signals_raise
from replaceme_exp.samples import samples_listener
from replaceme_exp.stages import observed_by
from replaceme_exp.surgery import checkpoint_problem, recipe_problem, recover_checkpoint
from replaceme_exp.tracking import WandbRun

log = logging.getLogger("replaceme_exp.job")


def run_recorded(
    cfg: DictConfig,
    sweep_id: str | None = None,
    raise_on_failure: bool = True,
    job_dir: str | os.PathLike | None = None,
    run_name: str | None = None,
    sweep_name: str | None = None,
    overrides: list[str] | None = None,
) -> dict:
    """Run one job unless its config hash already has a finished row (and ``force`` is off), and
    always leave a row behind. Everything the job writes besides its row and model goes to
    ``job_dir`` (the Hydra job directory; default ``results_dir/jobs/<run_id>``): the W&B run and
    CodeCarbon's files. ``overrides``: the command line's (keys given together are checked
    together). Returns the row (the existing finished one, with status ``skipped``, when skipped).
    Rank 0 of a job over several processes tells the others whether the job runs
    (:func:`~replaceme_exp.capture.distributed.announce`): when it starts, else (refused, skipped,
    failed before) on the way out."""
    try:
        return _run_recorded(cfg, sweep_id, raise_on_failure, job_dir, run_name, sweep_name, overrides)
    finally:
        try:
            distributed.announce(None)
        except distributed.CollectiveFailed as err:
            log.warning("%s", err)


def _run_recorded(
    cfg: DictConfig,
    sweep_id: str | None,
    raise_on_failure: bool,
    job_dir: str | os.PathLike | None,
    run_name: str | None,
    sweep_name: str | None,
    overrides: list[str] | None,
) -> dict:
    """:func:`run_recorded`."""
    try:
        spec = JobSpec.from_config(cfg)
        check_given_together(spec.config, overridden_keys(overrides or []))
        c = spec.config
        results_dir, cache_dir = Path(to_absolute_path(c.results_dir)), Path(to_absolute_path(c.cache_dir))
        if shape := model_shape(c.model, cache_dir):
            check_shape(c, shape)
    except ConfigError as err:
        return refused(cfg, err, sweep_id, raise_on_failure)
    store = ResultsStore(results_dir)
    try:
        weights = weights_fingerprint(c.model, cache_dir)
    except Exception as err:  # noqa: BLE001 - e.g. the embedded model is missing: loading fails with a clear error
        log.warning("model fingerprint unavailable: %s", err)
        weights = None
    spec = spec.with_weights(weights)
    chash = spec.config_hash
    with config_lock(results_dir, chash):
        model_dir = results_dir / "models" / chash
        remove_leftovers(store, chash, model_dir, c.store.directory)
        done = store.finished_row(chash) if not c.force else None
        if done is not None and (problem := missing_output(spec, results_dir)):
            log.warning("finished run %s: %s: running again", done["run_id"], problem)
            done = None
        if done is not None:
            # said once, by the job's summary line ("job skipped: finished before as run ...")
            log.debug("skipping: a finished row exists for config_hash=%s", chash)
            record_skip(store, done, sweep_id, sweep_name, job_dir)
            done["status"] = "skipped"
            done["row_path"] = str(store.row_path(done))
            return done
        try:  # the configuration's own folders (its rows, its model), its files and hub datasets, before
            # anything is computed or its model loads (not for a skipped job)
            writable_directory("results_dir", str(results_dir), results_subfolders(c, chash))
            spec.check_inputs()
        except ConfigError as err:
            return refused(cfg, err, sweep_id, raise_on_failure)
        row = start_row(chash, spec.setting_hash, sweep_id, spec.setting_columns(), store.next_run_seq(chash))
        row.update(model_fingerprint=weights, sweep_name=sweep_name)
        row["sweep_group"] = " ".join(filter(None, [sweep_name, sweep_id])) or None
        job_dir = Path(job_dir) if job_dir else results_dir / "jobs" / row["run_id"]
        paths = JobPaths(results_dir, cache_dir, job_dir)
        tracker = WandbRun(c.tracking.wandb, OmegaConf.to_container(cfg, resolve=True), row, job_dir, run_name)
        return run_and_record(spec, paths, row, store, tracker, raise_on_failure)


def record_skip(
    store: ResultsStore, finished: dict, sweep_id: str | None, sweep_name: str | None, job_dir
) -> Path | None:
    """Write the skipped job's own row (:func:`~replaceme_exp.results.row.skip_row`: its sweep and the
    finished run it stands for), so that its sweep's report lists it; returns its path. A row that
    cannot be written costs the skip nothing: a warning says so."""
    row = skip_row(finished, sweep_id, sweep_name, str(job_dir) if job_dir else None)
    try:
        return store.write(row)
    except OSError as err:
        log.warning("skipped job's row not written under %s: %s", store.skips / row["config_hash"], err)
        return None


def missing_output(spec: JobSpec, results_dir: Path) -> str | None:
    """What a finished run of ``spec``'s configuration was to leave and is not there whole (its
    model, checked against the list of files its save wrote; its transforms file and the recipe
    that lists its size), or None."""
    chash = spec.config_hash
    if spec.saves_model and (problem := checkpoint_problem(results_dir / "models" / chash)):
        return f"its model is not whole ({problem})"
    transforms = results_dir / "transforms" / f"{chash}.safetensors"
    if spec.model_save == "transform" and (problem := recipe_problem(transforms)):
        return f"its saved transforms are not whole ({problem})"
    if spec.job == "prune" and spec.config.save_transforms and not transforms.is_file():
        return f"its transforms file {transforms} is missing"
    return None


def remove_leftovers(store: ResultsStore, config_hash: str, model_dir: Path, token_stores: str | None) -> None:
    """Put back a finished model a killed save moved aside, and remove what killed runs of the
    configuration left: partial saves, token stores, temporary row files. The caller holds the
    configuration's lock."""
    recover_checkpoint(model_dir)
    if removed := TokenStore.remove_leftovers(config_hash, token_stores):
        log.info("removed %d token store(s) a killed run of this configuration left", removed)
    if removed := store.remove_leftovers(config_hash):
        log.info("removed %d temporary row file(s) a killed run of this configuration left", len(removed))


def refused(cfg: DictConfig, err: ConfigError, sweep_id: str | None, raise_on_failure: bool) -> dict:
    """The failed row of a configuration refused before it ran (the error is the job summary's
    line: not logged twice, nor whether its row could not be written: the error says so)."""
    row = refused_row(cfg, err, sweep_id)
    try:
        row["row_path"] = str(ResultsStore(to_absolute_path(cfg.results_dir)).write(row))
    except Exception as write_err:  # noqa: BLE001 - results_dir itself may be the bad value
        row["error"] += f" (no row written: {write_err})"
    if raise_on_failure:
        raise err
    return row


def run_and_record(
    spec: JobSpec, paths: JobPaths, row: dict, store: ResultsStore, tracker: WandbRun, raise_on_failure: bool
) -> dict:
    """Run the job with its W&B run open and write its row, finished or failed."""
    configure_from(spec.config.progress)
    quiet_library_bars()
    console_skips_file_only()
    row["job_dir"] = str(paths.job_dir)
    row["row_path"] = str(store.row_path(row))
    started = time.perf_counter()
    row["wandb_dir"] = None  # the run's folder once it is open (WandbRun.ready)
    try:
        tracker.start()
    except Exception as err:  # noqa: BLE001 - tracking must not cost the job
        log.warning("W&B run not started: %s", err)
        tracker.run = None
    failure = None
    try:
        with (
            stop_signals_raise(),
            progress_listener(tracker.progress),
            samples_listener(tracker.samples),
            observed_by(tracker.stage_starts),
        ):
            distributed.announce({"weights": spec.weights})
            run_job(spec, paths, row, tracker.stage)
    except Exception as err:  # noqa: BLE001 - every failure becomes a row
        failure = err
        row.update(status="failed", error=f"{type(err).__name__}: {err}")
        if isinstance(err, JobInterrupted) and (ranks := distributed.ranks()) is not None:
            row["error"] += f" (one of {ranks.world_size} ranks: the launcher stops them all when one fails)"
        # A configuration error or a stop signal is said in one line by the job's summary (run.py);
        # anything else is the project's bug: its traceback goes to the log file.
        if not isinstance(err, (ConfigError, JobInterrupted, distributed.CollectiveFailed)):
            where = f" in stage {row['failed_stage']}" if row.get("failed_stage") else ""
            files = log_files()
            log.error("job failed%s: %s%s", where, row["error"], f" (traceback in {files[0]})" if files else "")
            log.error("traceback of the failure:\n%s", traceback.format_exc(), extra=FILE_ONLY)
    row["time_total_s"] = time.perf_counter() - started
    try:
        with stop_signals_deferred():  # a stop signal now (a launcher stopping every rank) waits for the row
            return record(row, failure, store, tracker, raise_on_failure)
    except JobInterrupted as stopped:
        stopped.row = row
        raise


def record(row: dict, failure: Exception | None, store: ResultsStore, tracker: WandbRun, raise_on_failure: bool):
    """Close the W&B run and write the row, finished or failed; raise ``failure`` when the caller
    asked for it (or it was a stop signal). Returns the row."""
    try:
        tracker.finish(row)
    except Exception as err:  # noqa: BLE001 - tracking must not cost the row
        log.warning("W&B logging failed: %s", err)
    try:
        path = store.write(row)
    except OSError as err:  # e.g. a full disk: no partial row file is left; said in one line
        lost = f"row not written under {store.runs / row['config_hash']}: {err}"
        if failure is None and not raise_on_failure:  # the job summary's line says it
            row.update(status="failed", error=f"{type(err).__name__}: {lost}", failed_stage="save")
            return row
        log.error("%s", lost)
        if failure is None:
            raise
        path = None
    if failure is not None:
        log.debug("failed row written to %s", path)
        if raise_on_failure or isinstance(failure, JobInterrupted):
            failure.row = row  # what the caller reports before it stops
            raise failure
    return row
