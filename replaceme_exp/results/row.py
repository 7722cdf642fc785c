"""A job's row: the columns every row starts with, the row of a configuration refused before it ran,
the row of a job skipped as finished before, and the codec of its cells (lists and dicts are stored
as JSON text; :func:`decode_cell` and :func:`cuts_of` read them back, whether a row comes from the
store or from a running job)."""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import socket
import subprocess
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from replaceme_exp.storage import content_key


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


@functools.cache
def git_sha() -> str | None:
    """The commit of the code this process imported (read once: a long sweep records the code it
    runs, not a commit made while it ran)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


git_sha()


# The libraries whose code computes the numbers of every job, by the name their row column takes
# (``<name>_version``) and the distribution that installs them.
LIBRARIES = {"torch": "torch", "transformers": "transformers", "torchmin": "pytorch-minimize"}

# The versions a protocol's numbers were made with, where it names them (protocol=official: the official
# code's setup.py and what its unpinned torchmin could install in May 2025).
PROTOCOL_LIBRARIES = {"official": {"transformers": "4.46.3", "torchmin": "0.0.2"}}


def library_versions(extra: tuple[str, ...] = ()) -> dict[str, str | None]:
    """Versions of the libraries whose code computes the numbers (recorded in every row), and of
    the ``extra`` packages a kind of job also depends on."""
    out = {}
    for name, distribution in [*LIBRARIES.items(), *((package, package) for package in extra)]:
        try:
            out[name] = version(distribution)
        except PackageNotFoundError:
            out[name] = None
    return out


def protocol_library_columns(protocol: str | None, installed: dict[str, str | None] | None = None) -> dict[str, Any]:
    """``<library>_version_protocol``: the version ``protocol``'s numbers were made with (None: it names
    none); ``<library>_off_protocol``: the ``installed`` one (default: :func:`library_versions`) differs
    (tables mark such rows)."""
    expected = PROTOCOL_LIBRARIES.get(protocol or "", {})
    installed = library_versions() if installed is None else installed
    out: dict[str, Any] = {}
    for name in sorted({n for versions in PROTOCOL_LIBRARIES.values() for n in versions}):
        out[f"{name}_version_protocol"] = expected.get(name)
        out[f"{name}_off_protocol"] = name in expected and installed.get(name) != expected[name]
    return out


def scheduler_context(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Where the process runs: ``host``, and under SLURM the job (``<array job>_<task>`` for a job of an
    array, as submitit names its folder ``hydra/submitit/<job>``) and how many times SLURM requeued it
    (``SLURM_RESTART_COUNT``: a preempted job's rerun says 1)."""
    env = os.environ if environ is None else environ
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else env.get("SLURM_JOB_ID")
    restarts = env.get("SLURM_RESTART_COUNT")
    return {
        "host": socket.gethostname(),
        "slurm_job": job,
        "slurm_restarts": int(restarts) if job and restarts and restarts.isdigit() else (0 if job else None),
    }


def start_row(
    config_hash: str, setting_hash: str, sweep_id: str | None, settings: dict[str, Any], run_seq: int | None = None
) -> dict:
    """A new run's row: its identity (``run_seq``: its place among its configuration's runs,
    :meth:`~replaceme_exp.results.store.ResultsStore.next_run_seq`), the code and libraries, and the
    job's setting columns."""
    versions = library_versions()
    return {
        "run_id": new_run_id(),
        "sweep_id": sweep_id,
        "config_hash": config_hash,
        "setting_hash": setting_hash,
        "status": "running",
        "error": None,
        "started_at": now(),
        "run_seq": run_seq,
        "git_sha": git_sha(),
        "cached_stages": [],
        **scheduler_context(),
        **{f"{package}_version": v for package, v in versions.items()},
        **protocol_library_columns(settings.get("protocol"), versions),
        **settings,
        "selection_distance": None,
        "candidate_distances": None,  # [[start, end, distance], ...] over all candidates
        "layer_distances": None,  # (num_layers, num_layers) mean cosine distances, with record_layer_distances
        "pruned_model_path": None,
    }


def refused_row(cfg: DictConfig, err: Exception, sweep_id: str | None) -> dict:
    """The failed row of a configuration refused before it ran (its config hash from the raw
    config, since its effective settings cannot be derived)."""
    try:
        raw = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # noqa: BLE001
        raw = str(cfg)
    chash = "invalid-" + content_key(raw, 16)
    return {
        "run_id": new_run_id(),
        "sweep_id": sweep_id,
        "config_hash": chash,
        "status": "failed",
        "error": f"{type(err).__name__}: {err}",
        "failed_stage": "validation",
        "started_at": now(),
        "git_sha": git_sha(),
        "job": OmegaConf.select(cfg, "job", default=None, throw_on_resolution_failure=False),
        "model": OmegaConf.select(cfg, "model.name", default=None, throw_on_resolution_failure=False),
        "objective": OmegaConf.select(cfg, "objective.name", default=None, throw_on_resolution_failure=False),
    }


def skip_row(
    finished: dict,
    sweep_id: str | None,
    sweep_name: str | None = None,
    job_dir: str | None = None,
) -> dict:
    """The row of a job skipped because its configuration has the finished row ``finished``: the
    job's own identity (its run id, sweep, Hydra job folder, when it was skipped) and, in
    ``finished_run_id``, the run it stands for. No setting or measured column: the finished row
    holds them (:meth:`~replaceme_exp.results.store.ResultsStore.load_skips`)."""
    return {
        "run_id": new_run_id(),
        "sweep_id": sweep_id,
        "config_hash": finished["config_hash"],
        "status": "skipped",
        "finished_run_id": finished["run_id"],
        "started_at": now(),
        "git_sha": git_sha(),
        "sweep_name": sweep_name,
        "sweep_group": " ".join(filter(None, [sweep_name, sweep_id])) or None,
        "job_dir": job_dir,
    }


def encode_cell(value: Any) -> Any:
    """A parquet-friendly cell: lists, tuples and dicts as JSON text."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def decode_cell(value: Any) -> Any:
    """A cell as the job wrote it: JSON text back to lists and dicts (other text as it is)."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def cuts_of(value: Any) -> list[tuple[int, int]] | None:
    """The ``cuts`` cell as ``[(start, end), ...]`` (None when the row has none)."""
    value = decode_cell(value)
    if value is None or isinstance(value, str) or (isinstance(value, float) and value != value):
        return None
    return [(int(s), int(e)) for s, e in value]


def format_cuts(value: Any, missing: str = "none") -> str:
    """``[11,19) [20,24)``: the cuts of a row for a person; ``missing`` without any."""
    cuts = cuts_of(value)
    if not cuts:
        return value if isinstance(value, str) and value else missing
    return " ".join(f"[{s},{e})" for s, e in cuts)
