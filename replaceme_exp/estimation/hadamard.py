"""Hadamard matrices of the sizes LinearPatch's official code rotates (its ``rotate_utils/hadamard_utils.py``,
adapted there from QuIP#): ``n = K * 2^m`` with ``K`` one of the stored orders below (1: a power of two).

:func:`hadamard_matrix` builds the same orthonormal matrix as the official ``get_hadamard_matrix(n)``
(``matmul_hadU`` applied to the identity: a butterfly over the ``2^m`` factor, then the stored
``K x K`` matrix, scaled by ``1 / sqrt(n)``): the same signs, so a rotation here is the rotation the
official code applies. The scale is taken in float64 (the official ``torch.tensor(n).sqrt()`` is a
float32 square root, off by up to 3e-8 relative: below the float32 resolution its patch is kept in).
Sizes are matched in the official order (172 first, 12 last); a size whose first matching ``K``
leaves a quotient that is no power of two is refused, as the official ``assert`` refuses it.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

import torch

# The matrices of the official code (MIT licence), in the order its ``get_hadK`` tries them: the
# format is described in the data file itself.
_STORED = json.loads(resources.files(__package__).joinpath("hadamard_matrices.json").read_text())
ORDERS: tuple[int, ...] = tuple(_STORED["orders"])
_ROWS: dict[int, tuple[str, ...]] = {int(k): tuple(rows) for k, rows in _STORED["rows"].items()}


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def hadamard_order(n: int) -> int | None:
    """The stored order ``K`` the official code uses for size ``n`` (1: a power of two), or None when
    it refuses ``n`` (its first dividing ``K`` leaves no power of two, or none divides and ``n`` is
    no power of two)."""
    for k in ORDERS:
        if n % k == 0:
            return k if is_power_of_two(n // k) else None
    return 1 if is_power_of_two(n) else None


def supported_sizes_text() -> str:
    """The sizes :func:`hadamard_matrix` takes, in words (for error messages)."""
    orders = ", ".join(str(k) for k in sorted(ORDERS))
    return f"K * 2^m with K in {{1, {orders}}} (first dividing K in the official order)"


def stored_matrix(k: int) -> torch.Tensor:
    """The stored K x K +-1 matrix (float64)."""
    rows = _ROWS[k]
    bits = [[1.0 if b == "1" else -1.0 for b in format(int(r, 16), f"0{4 * len(r)}b")[:k]] for r in rows]
    return torch.tensor(bits, dtype=torch.float64)


@lru_cache(maxsize=8)
def _hadamard(n: int) -> torch.Tensor:
    k = hadamard_order(n)
    if k is None:
        raise ValueError(f"no Hadamard matrix of size {n}: sizes are {supported_sizes_text()}")
    # matmul_hadU(I): every row of the identity through the butterfly, then the K x K block
    x = torch.eye(n, dtype=torch.float64).view(-1, n, 1)
    out = x.clone()
    while x.shape[1] > k:
        x = x.view(x.shape[0], x.shape[1] // 2, 2, x.shape[2])
        out = out.view(x.shape)
        out[:, :, 0, :] = x[:, :, 0, :] + x[:, :, 1, :]
        out[:, :, 1, :] = x[:, :, 0, :] - x[:, :, 1, :]
        out = out.view(x.shape[0], x.shape[1], -1)
        x, out = out, x
    if k > 1:
        x = stored_matrix(k).view(1, k, k) @ x
    return x.reshape(n, n) / math.sqrt(n)


def hadamard_matrix(n: int) -> torch.Tensor:
    """The official code's orthonormal Hadamard matrix of size ``n``, (n, n) float64 (a copy); a
    hidden state ``x`` (..., n) is rotated as ``x @ H``. Raises ValueError for a size it refuses."""
    return _hadamard(int(n)).clone()
