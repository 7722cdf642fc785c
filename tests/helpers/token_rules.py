"""What the unit and integration tests of token rules share: fixtures, builders and constants."""

from __future__ import annotations

import pytest
from helpers.models import tiny_model


NUM_LAYERS = 6


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", NUM_LAYERS)


TINY = [
    "model=tiny_llama",
    "calibration.n_samples=16",
    "calibration.seq_len=32",
    "eval.seq_len=32",
    "eval.max_windows=4",
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
    "eval=heldout",  # held-out perplexity only (eval=quick would add lm-eval's offline tasks)
    "save_model=false",
    "cuts=[[2,4]]",
]
