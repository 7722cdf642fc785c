"""Representation similarity between ``L_{start-1}`` and ``L_{end-1}`` from streamed moments:
linear CKA (Kornblith et al., 2019) and mean canonical correlation (CCA; Morcos et al., 2018),
the block-selection appendix's alternatives to the cosine distance.

Both follow from running sums over the non-padding tokens: per block ``k`` the sum of ``L_k``
and ``L_k^T L_k``, per cut the cross product ``L_{start-1}^T L_{end-1}``, all in float64. With
``n`` tokens, ``X = L_{start-1}`` and ``Y = L_{end-1}`` (n, d), the centred moments are
``Sxx = X^T X - n mx mx^T``, ``Syy`` likewise and ``Sxy = X^T Y - n mx my^T``; then

- linear CKA = ||Sxy||_F^2 / (||Sxx||_F ||Syy||_F), in [0, 1];
- mean CCA = mean of the singular values of ``Wx Sxy Wy`` with ``Wx = (Sxx + eps I)^{-1/2}``,
  ``eps = CCA_RIDGE * trace(Sxx) / d`` (a relative ridge for directions without variance),
  each clamped to [0, 1].

No (n, d) buffer over the data set exists: memory is (blocks + cuts) d x d float64 matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaceme_exp.capture.statistics import PRECISIONS, ActKey, BatchTokens, Cut, Request, add_product

CCA_RIDGE = 1e-6


@dataclass
class Moments:
    """Streamed moments of one cut over ``n`` tokens: sums (d,) and products (d, d), float64."""

    n: int
    sum_x: torch.Tensor
    sum_y: torch.Tensor
    xtx: torch.Tensor
    yty: torch.Tensor
    xty: torch.Tensor

    def centred(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Sxx, Syy, Sxy), each (d, d): the moments about the means."""
        mx, my = self.sum_x / self.n, self.sum_y / self.n
        return (
            self.xtx - self.n * torch.outer(mx, mx),
            self.yty - self.n * torch.outer(my, my),
            self.xty - self.n * torch.outer(mx, my),
        )


def linear_cka(moments: Moments) -> float:
    """Linear CKA of the cut's two representations, in [0, 1] (1: equal up to rotation and scale)."""
    sxx, syy, sxy = moments.centred()
    denominator = torch.linalg.matrix_norm(sxx) * torch.linalg.matrix_norm(syy)
    if float(denominator) == 0.0:
        return 0.0
    return float(torch.linalg.matrix_norm(sxy) ** 2 / denominator)


def inverse_sqrt(s: torch.Tensor, ridge: float = CCA_RIDGE) -> torch.Tensor:
    """``(S + eps I)^{-1/2}`` of a symmetric PSD (d, d) matrix, ``eps = ridge * trace(S) / d``."""
    d = s.shape[0]
    eps = ridge * float(torch.trace(s)) / d or ridge
    values, vectors = torch.linalg.eigh((s + s.T) / 2)
    scale = (values.clamp(min=0.0) + eps).rsqrt()
    return (vectors * scale) @ vectors.T


def canonical_correlations(moments: Moments, ridge: float = CCA_RIDGE) -> torch.Tensor:
    """The d canonical correlations of the cut's two representations, (d,), descending, in [0, 1]."""
    sxx, syy, sxy = moments.centred()
    whitened = inverse_sqrt(sxx, ridge) @ sxy @ inverse_sqrt(syy, ridge)
    return torch.linalg.svdvals(whitened).clamp(0.0, 1.0)


def mean_cca(moments: Moments, ridge: float = CCA_RIDGE) -> float:
    """Mean canonical correlation, in [0, 1]."""
    return float(canonical_correlations(moments, ridge).mean())


class SimilarityStatistics:
    """Accumulates the :class:`Moments` of every cut over all non-padding tokens (products in
    ``precision``, summed in float64: :func:`~replaceme_exp.capture.statistics.add_product`). Blocks shared
    by several cuts (as ``start - 1`` of one and ``end - 1`` of another) keep one sum and one
    ``L_k^T L_k``; each cut adds its own cross product. :func:`linear_cka_per_cut` and
    :func:`mean_cca_per_cut` turn them into similarities."""

    takes_padding = False  # padded positions are not data: never compared

    def __init__(self, cuts: list[Cut], hidden_size: int, device: torch.device, precision: str = "float64"):
        if precision not in PRECISIONS:
            raise ValueError(f"capture.precision={precision!r}: choose one of {PRECISIONS}")
        self.cuts, self.precision = list(cuts), precision
        self.dtype = torch.float64 if precision == "float64" else torch.float32
        blocks = sorted({k for start, end in self.cuts for k in (start - 1, end - 1)})
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        self.sums = {k: zeros(hidden_size) for k in blocks}
        self.grams = {k: zeros(hidden_size, hidden_size) for k in blocks}
        self.counts = {k: 0 for k in blocks}
        self.cross = {cut: zeros(hidden_size, hidden_size) for cut in self.cuts}

    def requests(self) -> list[Request]:
        out: list[Request] = [((("L", k),), self._block_updater(k)) for k in self.sums]
        out += [((("L", s - 1), ("L", e - 1)), self._cross_updater((s, e))) for s, e in self.cuts]
        return out

    def _block_updater(self, block: int):
        key: ActKey = ("L", block)

        def update(acts: dict, tokens: BatchTokens) -> None:
            x = acts[key].to(self.sums[block].device, self.dtype)
            self.sums[block] += x.sum(0, dtype=torch.float64)
            add_product(self.grams[block], x, x, self.precision)
            self.counts[block] += x.shape[0]

        return update

    def _cross_updater(self, cut: Cut):
        before, after = ("L", cut[0] - 1), ("L", cut[1] - 1)

        def update(acts: dict, tokens: BatchTokens) -> None:
            device = self.cross[cut].device
            x = acts[before].to(device, self.dtype)
            add_product(self.cross[cut], x, acts[after].to(device, self.dtype), self.precision)

        return update

    def moments(self, cut: Cut) -> Moments:
        start, end = cut
        a, b = start - 1, end - 1
        return Moments(self.counts[a], self.sums[a], self.sums[b], self.grams[a], self.grams[b], self.cross[cut])

    def check_tokens(self) -> None:
        if any(self.counts[start - 1] == 0 for start, _ in self.cuts):
            raise ValueError("no token reached the similarity statistics")


def linear_cka_per_cut(statistics: SimilarityStatistics) -> dict[Cut, float]:
    """Linear CKA of every cut of ``statistics``."""
    statistics.check_tokens()
    return {cut: linear_cka(statistics.moments(cut)) for cut in statistics.cuts}


def mean_cca_per_cut(statistics: SimilarityStatistics, ridge: float = CCA_RIDGE) -> dict[Cut, float]:
    """Mean CCA of every cut of ``statistics``; a block's whitening ``(S + eps I)^{-1/2}`` is computed
    once for all the cuts that share it."""
    statistics.check_tokens()
    out = {}
    whitened: dict[int, torch.Tensor] = {}
    for cut in statistics.cuts:
        sxx, syy, sxy = statistics.moments(cut).centred()
        for block, s in ((cut[0] - 1, sxx), (cut[1] - 1, syy)):
            if block not in whitened:
                whitened[block] = inverse_sqrt(s, ridge)
        correlations = torch.linalg.svdvals(whitened[cut[0] - 1] @ sxy @ whitened[cut[1] - 1])
        out[cut] = float(correlations.clamp(0.0, 1.0).mean())
    return out
