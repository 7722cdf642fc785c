"""What the unit, integration and e2e tests of tracking share: fixtures, builders and constants."""

from __future__ import annotations

from helpers.jobs import SMOKE


TRACKED = [*SMOKE, "tracking.wandb.mode=offline", "tracking.codecarbon.enabled=true"]  # the default tracking
