"""Tracking: CodeCarbon energy and emissions per stage, and one W&B run per job."""

from replaceme_exp.tracking.emissions import StageEmissions
from replaceme_exp.tracking.wandb_run import log_job_to_wandb

__all__ = ["StageEmissions", "log_job_to_wandb"]
