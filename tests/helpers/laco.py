"""What the unit and integration tests of laco share: fixtures, builders and constants."""

from __future__ import annotations

import torch


def params(block) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in block.named_parameters()}
