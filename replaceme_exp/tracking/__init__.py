"""Tracking: CodeCarbon energy and emissions per stage, and one W&B run per job."""

from replaceme_exp.tracking.emissions import StageEmissions
from replaceme_exp.tracking.wandb_run import WandbRun

__all__ = ["StageEmissions", "WandbRun"]
