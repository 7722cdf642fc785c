"""Hand-built stand-ins for the independent checks of surgery: a removed block, an MLP followed
by an explicit T, a block followed by an explicit T, and a random near-identity T."""

from __future__ import annotations

import torch
from torch import nn


class Bypass(nn.Module):
    """A removed block: passes the residual stream through (as a tuple where the family's blocks
    return one, as Falcon's do)."""

    def __init__(self, returns_tuple: bool = False):
        super().__init__()
        self.returns_tuple = returns_tuple

    def forward(self, hidden_states, *args, **kwargs):
        return (hidden_states, None) if self.returns_tuple else hidden_states


class TransformedMLP(nn.Module):
    """``M T``: the original MLP followed by an explicit T."""

    def __init__(self, mlp, transform):
        super().__init__()
        self.mlp, self.transform = mlp, transform

    def forward(self, x):
        return self.mlp(x) @ self.transform.to(x.dtype)


class TransformedBlock(nn.Module):
    """``L T``: the original block followed by an explicit T on its whole output."""

    def __init__(self, block, transform):
        super().__init__()
        self.block, self.transform = block, transform

    def forward(self, *args, **kwargs):
        out = self.block(*args, **kwargs)
        if isinstance(out, tuple):
            return (out[0] @ self.transform.float(), *out[1:])
        return out @ self.transform.float()


def random_transform(d: int, seed: int) -> torch.Tensor:
    """``I + 0.2 N(0, 1)`` in float64, (d, d)."""
    g = torch.Generator().manual_seed(seed)
    return torch.eye(d, dtype=torch.float64) + 0.2 * torch.randn(d, d, generator=g, dtype=torch.float64)
