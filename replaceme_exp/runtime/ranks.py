"""``run.py`` as one of several processes of one job (``torchrun --nproc-per-node N run.py ...``, or
``srun`` with several tasks): join the process group, mark the logs with the rank, and on a rank
other than 0 take the job's share of the calibration captures and nothing else.

Rank 0 runs the job as a one-process job does (its row, model, W&B run, CodeCarbon, statistics
cache) and tells the other ranks whether it runs it at all (:func:`~replaceme_exp.capture.distributed.announce`:
not when the configuration is refused or already finished). The other ranks run the stages up to
the estimate with captures split over the ranks (:class:`~replaceme_exp.pipeline.job.PruningJob`),
then exit 0 without writing anything but their log (``run_rank<r>.log``).
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import torch
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.capture import distributed
from replaceme_exp.capture.distributed import Ranks, ranks_from_env
from replaceme_exp.errors import first_line
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.pipeline.job import PruningJob
from replaceme_exp.pipeline.modality import JobPaths
from replaceme_exp.runtime.log_files import prefix_logs
from replaceme_exp.runtime.signals import stop_signals_raise

log = logging.getLogger("replaceme_exp.job")

DEFAULT_TIMEOUT_S = 1800.0  # capture.timeout_s's default, also when the configuration's value is bad


def follower_overrides(argv: list[str], env: dict | None = None) -> list[str]:
    """Hydra overrides for a rank other than 0 (none for rank 0 or one process): its log in
    ``run_rank<r>.log`` and no copy of the configuration (``.hydra``) beside it."""
    try:
        ranks = ranks_from_env(env)
    except (ValueError, RuntimeError):
        return []
    if ranks is None or ranks.rank == 0 or any(a.startswith(("-m", "--multirun")) for a in argv):
        return []
    return [f"hydra.job.name=run_rank{ranks.rank}", "hydra.output_subdir=null"]


def timeout_of(cfg: DictConfig) -> float:
    """``capture.timeout_s`` of ``cfg``; the default when it is not a positive number (the job then
    refuses the configuration in one line, on rank 0)."""
    value = OmegaConf.select(cfg, "capture.timeout_s", default=None, throw_on_resolution_failure=False)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT_S
    return value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT_S


def computes_on_cuda(cfg: DictConfig) -> bool:
    """Whether the job's model runs on a GPU (``model.device`` auto or cuda, a GPU present): NCCL."""
    device = str(OmegaConf.select(cfg, "model.device", default="auto", throw_on_resolution_failure=False))
    return torch.cuda.is_available() and (device in ("auto", "None") or device.startswith("cuda"))


def start_ranks(cfg: DictConfig) -> Ranks | None:
    """Join the job's process group when the environment says this process is one rank of several;
    from then on every log line starts with ``[rank r/N]``. None for a one-process job."""
    ranks = ranks_from_env()
    if ranks is None:
        return None
    prefix_logs(f"{ranks.label} ")
    distributed.start(ranks, timeout_of(cfg), computes_on_cuda(cfg))
    return ranks


def follow(cfg: DictConfig, job_dir: str) -> int:
    """A rank other than 0: its share of the calibration captures of the job rank 0 runs. Returns the
    exit code (0 also when rank 0 runs no job: rank 0 says why)."""
    ranks = distributed.ranks()
    try:
        with stop_signals_raise():
            message = distributed.leader_says()
            if message is None:
                log.info("rank 0 runs no job (refused or finished before): nothing to capture")
                return 0
            spec = JobSpec.from_config(cfg).with_weights(message["weights"])
            c = spec.config
            paths = JobPaths(Path(to_absolute_path(c.results_dir)), Path(to_absolute_path(c.cache_dir)), Path(job_dir))
            PruningJob(spec, paths).run({})
    except Exception as err:  # noqa: BLE001 - one line; rank 0 writes the failed row
        log.error("rank %d failed: %s: %s", ranks.rank, type(err).__name__, first_line(err))
        return 1
    log.info("captures shared with rank 0, which writes the row")
    return 0


def leave() -> None:
    """Leave the process group at the end of the process."""
    distributed.stop()
    sys.stdout.flush()
