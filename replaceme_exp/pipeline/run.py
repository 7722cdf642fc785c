"""Running a job: its clock (time, energy, emissions per stage), the job's stages, and the row's
closing columns whether it finishes or fails."""

from __future__ import annotations

from typing import Callable

import torch

from replaceme_exp.pipeline.clock import StageClock
from replaceme_exp.pipeline.evaluate import EvaluationJob
from replaceme_exp.pipeline.job import PruningJob
from replaceme_exp.pipeline.modality import JobPaths
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.stages import observed_by
from replaceme_exp.tracking.emissions import StageEmissions, job_gpu_ids


def run_job(
    spec: JobSpec, paths: JobPaths, row: dict, on_stage: Callable[[str, float, float | None], None] | None = None
) -> dict:
    """Prune and evaluate (``job=evaluate``: only evaluate); fills ``row`` as it goes (so a
    failure keeps what was measured, and ``failed_stage`` names the stage that failed), with the
    energy and emissions of each stage measured so far. ``on_stage(label, seconds, energy_kwh)`` hears
    of each finished stage. Returns the row, ``status=finished``."""
    c = spec.config
    gpu_ids = job_gpu_ids(c.model.device, c.model.device_map, torch.cuda.is_available(), torch.cuda.device_count())
    row["codecarbon_gpu_ids"] = gpu_ids
    tracking = c.tracking.codecarbon
    emissions = StageEmissions(
        tracking.enabled,
        tracking.country_iso_code,
        paths.job_dir / "codecarbon",
        gpu_ids,
        region=tracking.region,
        tracking_mode=tracking.tracking_mode,
    )
    clock = StageClock(emissions, on_stage)
    job = (EvaluationJob if spec.job == "evaluate" else PruningJob)(spec, paths)
    try:
        with observed_by(clock):
            device = job.run(row)
        row.update(clock.columns(device, healed=c.healing.name != "none"), status="finished")
        return row
    except BaseException:
        row["failed_stage"] = clock.failed
        raise
    finally:
        row.update(emissions.columns())
        emissions.close()
