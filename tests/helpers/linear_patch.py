"""What the unit, integration and e2e tests of linear patch share: fixtures, builders and constants."""

from __future__ import annotations

import torch


def sylvester(n: int) -> torch.Tensor:
    """The +-1 Sylvester-Hadamard matrix of a power of two, by doubling."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h
