"""What the unit, integration and e2e tests of healing share: fixtures, builders and constants."""

from __future__ import annotations


HEAL = ["cuts=[[2,4]]", "healing/data=pydoc", "healing.max_steps=6", "healing.context_length=64", "healing.log_every=2"]
