"""What the unit, integration and e2e tests of job output share: fixtures, builders and constants."""

from __future__ import annotations

from helpers.jobs import SMOKE


WANDB_ON = [*SMOKE, "tracking.wandb.mode=offline"]  # W&B as by default
