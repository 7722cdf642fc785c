"""Representation similarity between ``L_{start-1}`` and ``L_{end-1}`` from streamed moments:
linear CKA (Kornblith et al., 2019), mean canonical correlation (CCA) and projection-weighted CCA
(PWCCA; Morcos, Raghu and Bengio, 2018), the block-selection appendix's alternatives to the cosine
distance.

All follow from running sums over the non-padding tokens: per block ``k`` the sum of ``L_k``
and ``L_k^T L_k``, per cut the cross product ``L_{start-1}^T L_{end-1}``, all in float64. With
``n`` tokens, ``X = L_{start-1}`` and ``Y = L_{end-1}`` (n, d), the centred moments are
``Sxx = X^T X - n mx mx^T``, ``Syy`` likewise and ``Sxy = X^T Y - n mx my^T``; then

- linear CKA = ||Sxy||_F^2 / (||Sxx||_F ||Syy||_F), in [0, 1];
- mean CCA = mean of the canonical correlations ``rho_i``, the singular values of ``Wx Sxy Wy``
  with ``Wx = (Sxx + eps I)^{-1/2}``, ``eps = CCA_RIDGE * trace(Sxx) / d`` (a relative ridge for
  directions without variance), each clamped to [0, 1];
- PWCCA = ``sum_i alpha_i rho_i / sum_i alpha_i``, ``alpha_i = sum_j |<h_i, x_j>|``: how much of
  the first representation X (the cut's input ``L_{start-1}``; PWCCA is not symmetric) the i-th
  canonical variate ``h_i = Xc Wx u_i / ||Xc Wx u_i||`` (unit norm over the n tokens) accounts for,
  summed over X's d coordinates ``x_j`` (n,). With ``Wx Sxy Wy = U diag(rho) V^T``,
  ``<h_i, x_j> = (Sxx Wx u_i)_j / sqrt(u_i^T Wx Sxx Wx u_i)`` (``h_i`` is centred, so ``x_j``
  centred or not gives the same): the moments suffice.

Mean CCA and PWCCA are biased upward when the tokens are few for d: two independent
Gaussian representations score about ``0.85 sqrt(d / n)`` (for n >= 10 d; 0.64 at n = 2 d), not 0
(:data:`MIN_TOKENS_PER_DIM`). The reference code (google/svcca ``pwcca.py``) takes the weights from
``u_i^T (X - mean) + mean`` made orthonormal, without ``Wx``: the same as here only when X is
white; elsewhere its weights are not those of the canonical variates the paper defines.

Mean CCA and PWCCA are computed in the eigenbases of ``Sxx = Vx diag(lx) Vx^T`` and ``Syy``: the canonical
correlations are the singular values of ``diag(sx) Vx^T Sxy Vy diag(sy)``, ``s = (l + eps)^{-1/2}``,
whose left singular vectors are ``Vx^T U``.

No (n, d) buffer over the data set exists: memory is (blocks + cuts) d x d float64 matrices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replaceme_exp.capture.entry import StoredValue
from replaceme_exp.capture.statistics import PRECISIONS, ActKey, BatchTokens, Cut, Request, add_product
from replaceme_exp.row_format import MIN_TOKENS_PER_DIM

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


@dataclass(frozen=True)
class Whitening:
    """One representation's centred moment ``S = V diag(values) V^T`` (d, d), its eigenvalues clamped
    at 0, and the ridge ``eps = ridge * trace(S) / d``: ``(S + eps I)^{-1/2} = V diag(scale) V^T``."""

    vectors: torch.Tensor  # (d, d), the eigenvectors as columns
    values: torch.Tensor  # (d,)
    eps: float

    @classmethod
    def of(cls, s: torch.Tensor, ridge: float = CCA_RIDGE) -> Whitening:
        d = s.shape[0]
        eps = ridge * float(torch.trace(s)) / d or ridge
        values, vectors = torch.linalg.eigh((s + s.T) / 2)
        return cls(vectors, values.clamp(min=0.0), eps)

    @property
    def scale(self) -> torch.Tensor:
        """(d,): ``(values + eps)^{-1/2}``."""
        return (self.values + self.eps).rsqrt()

    def inverse_sqrt(self) -> torch.Tensor:
        """(d, d): ``(S + eps I)^{-1/2}``."""
        return (self.vectors * self.scale) @ self.vectors.T


def inverse_sqrt(s: torch.Tensor, ridge: float = CCA_RIDGE) -> torch.Tensor:
    """``(S + eps I)^{-1/2}`` of a symmetric PSD (d, d) matrix, ``eps = ridge * trace(S) / d``."""
    return Whitening.of(s, ridge).inverse_sqrt()


@dataclass(frozen=True)
class CanonicalAnalysis:
    """``correlations`` (k,): the canonical correlations, descending, in [0, 1]; ``weights`` (k,): the
    projection weights of X's canonical variates, summing to 1 (all 0 when X has no variance; None
    when not computed)."""

    correlations: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def mean(self) -> float:
        """Mean CCA."""
        return float(self.correlations.mean())

    @property
    def projection_weighted(self) -> float:
        """PWCCA: the canonical correlations weighted by ``weights``."""
        if self.weights is None:
            raise ValueError("the projection weights were not computed (weighted=False)")
        return float((self.weights * self.correlations).sum())


def canonical_analysis(wx: Whitening, sxy: torch.Tensor, wy: Whitening, weighted: bool = True) -> CanonicalAnalysis:
    """The canonical correlations of two representations from their whitenings and centred cross
    moment ``sxy`` (d, d), and with ``weighted`` the projection weights of X's canonical variates
    (a full SVD instead of the singular values alone)."""
    cross = wx.scale[:, None] * (wx.vectors.T @ sxy @ wy.vectors) * wy.scale[None, :]  # Wx Sxy Wy in eigenbases
    if not weighted:
        return CanonicalAnalysis(torch.linalg.svdvals(cross).clamp(0.0, 1.0))
    left, correlations, _ = torch.linalg.svd(cross, full_matrices=False)
    return CanonicalAnalysis(correlations.clamp(0.0, 1.0), projection_weights(wx, left))


def projection_weights(wx: Whitening, left: torch.Tensor) -> torch.Tensor:
    """PWCCA's ``alpha_i / sum alpha``, (k,), for X's canonical directions given in its eigenbasis:
    ``left`` (d, k) holds ``Vx^T u_i``. ``Sxx Wx u_i = Vx diag(values * scale) left_i`` (d,) holds
    ``<h_i, x_j> ||Xc Wx u_i||`` for every coordinate j, and
    ``||Xc Wx u_i||^2 = sum_m values_m scale_m^2 left_mi^2``."""
    products = wx.vectors @ ((wx.values * wx.scale)[:, None] * left)
    norms = ((wx.values * wx.scale**2)[:, None] * left**2).sum(0).sqrt()
    alpha = products.abs().sum(0) / norms.clamp(min=torch.finfo(norms.dtype).tiny)
    alpha = torch.where(norms > 0, alpha, torch.zeros_like(alpha))  # a variate without variance
    total = alpha.sum()
    return alpha / total if float(total) > 0 else alpha


def canonical_correlations(moments: Moments, ridge: float = CCA_RIDGE) -> torch.Tensor:
    """The d canonical correlations of the cut's two representations, (d,), descending, in [0, 1]."""
    return moments_analysis(moments, ridge, weighted=False).correlations


def moments_analysis(moments: Moments, ridge: float = CCA_RIDGE, weighted: bool = True) -> CanonicalAnalysis:
    """:func:`canonical_analysis` of one cut's moments."""
    sxx, syy, sxy = moments.centred()
    return canonical_analysis(Whitening.of(sxx, ridge), sxy, Whitening.of(syy, ridge), weighted)


def mean_cca(moments: Moments, ridge: float = CCA_RIDGE) -> float:
    """Mean canonical correlation, in [0, 1]."""
    return moments_analysis(moments, ridge, weighted=False).mean


def pwcca(moments: Moments, ridge: float = CCA_RIDGE) -> float:
    """Projection-weighted canonical correlation (weights from the first representation), in [0, 1]."""
    return moments_analysis(moments, ridge).projection_weighted


class SimilarityStatistics:
    """Accumulates the :class:`Moments` of every cut over all non-padding tokens (products in
    ``precision``, summed in float64: :func:`~replaceme_exp.capture.statistics.add_product`). Blocks shared
    by several cuts (as ``start - 1`` of one and ``end - 1`` of another) keep one sum and one
    ``L_k^T L_k``; each cut adds its own cross product. :func:`linear_cka_per_cut`,
    :func:`mean_cca_per_cut`, :func:`pwcca_per_cut` and :func:`similarities_per_cut` turn them into
    similarities."""

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

    @property
    def n_tokens(self) -> int:
        """Tokens the moments of every cut were taken over."""
        return min(self.counts.values())

    def check_tokens(self) -> None:
        if any(self.counts[start - 1] == 0 for start, _ in self.cuts):
            raise ValueError("no token reached the similarity statistics")


@dataclass(frozen=True)
class Similarities:
    """A cut's linear CKA, mean CCA and PWCCA over ``n_tokens`` tokens."""

    linear_cka: float
    mean_cca: float
    pwcca: float
    n_tokens: int


@dataclass
class StoredSimilarities(StoredValue):
    """The cache entry of ``cut``'s :class:`Similarities` under ``criterion`` (the ridge, the products'
    precision)."""

    kind: ClassVar[str] = "similarity"
    version: ClassVar[int] = 1

    cut: Cut
    criterion: str
    value: Similarities | None = None

    def identity(self) -> dict:
        return {"cut": list(self.cut), "criterion": self.criterion}

    def state(self) -> dict[str, torch.Tensor]:
        names = ("linear_cka", "mean_cca", "pwcca")
        values = {name: torch.tensor(getattr(self.value, name), dtype=torch.float64) for name in names}
        return {**values, "n_tokens": torch.tensor(self.value.n_tokens)}

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        values = {name: state[name].item() for name in ("linear_cka", "mean_cca", "pwcca")}
        self.value = Similarities(**values, n_tokens=int(state["n_tokens"]))


def canonical_per_cut(
    statistics: SimilarityStatistics, ridge: float = CCA_RIDGE, weighted: bool = True
) -> dict[Cut, CanonicalAnalysis]:
    """:func:`canonical_analysis` of every cut of ``statistics``; a block's whitening is computed once
    for all the cuts that share it."""
    statistics.check_tokens()
    out = {}
    whitenings: dict[int, Whitening] = {}
    for cut in statistics.cuts:
        sxx, syy, sxy = statistics.moments(cut).centred()
        for block, s in ((cut[0] - 1, sxx), (cut[1] - 1, syy)):
            if block not in whitenings:
                whitenings[block] = Whitening.of(s, ridge)
        out[cut] = canonical_analysis(whitenings[cut[0] - 1], sxy, whitenings[cut[1] - 1], weighted)
    return out


def linear_cka_per_cut(statistics: SimilarityStatistics) -> dict[Cut, float]:
    """Linear CKA of every cut of ``statistics``."""
    statistics.check_tokens()
    return {cut: linear_cka(statistics.moments(cut)) for cut in statistics.cuts}


def mean_cca_per_cut(statistics: SimilarityStatistics, ridge: float = CCA_RIDGE) -> dict[Cut, float]:
    """Mean CCA of every cut of ``statistics``."""
    return {cut: found.mean for cut, found in canonical_per_cut(statistics, ridge, weighted=False).items()}


def pwcca_per_cut(statistics: SimilarityStatistics, ridge: float = CCA_RIDGE) -> dict[Cut, float]:
    """PWCCA of every cut of ``statistics``."""
    return {cut: found.projection_weighted for cut, found in canonical_per_cut(statistics, ridge).items()}


def similarities_per_cut(statistics: SimilarityStatistics, ridge: float = CCA_RIDGE) -> dict[Cut, Similarities]:
    """Linear CKA, mean CCA and PWCCA of every cut of ``statistics`` (one SVD per cut)."""
    cka = linear_cka_per_cut(statistics)
    n = statistics.n_tokens
    return {
        cut: Similarities(cka[cut], found.mean, found.projection_weighted, n)
        for cut, found in canonical_per_cut(statistics, ridge).items()
    }


def undersampled(n_tokens: int, hidden_size: int) -> bool:
    """Whether ``n_tokens`` are too few for mean CCA / PWCCA in ``hidden_size`` dimensions
    (fewer than :data:`MIN_TOKENS_PER_DIM` per dimension)."""
    return n_tokens < MIN_TOKENS_PER_DIM * hidden_size


def undersampled_message(n_tokens: int, hidden_size: int, data: str) -> str:
    """What :func:`undersampled` means for the similarities over ``data`` (a line for the log)."""
    return (
        f"{data} mean CCA / PWCCA over {n_tokens} tokens, fewer than {MIN_TOKENS_PER_DIM} x d = "
        f"{MIN_TOKENS_PER_DIM * hidden_size}: biased upward (two independent representations score about "
        f"0.85 sqrt(d / n) = {0.85 * (hidden_size / n_tokens) ** 0.5:.2f})"
    )


def similarity_columns(found: dict[Cut, Similarities], suffix: str, hidden_size: int) -> dict:
    """A row's columns for the similarities of its cuts (means over the cuts): ``linear_cka_<suffix>``,
    ``mean_cca_<suffix>``, ``pwcca_<suffix>``, the tokens they used (``similarity_tokens_<suffix>``)
    and whether those are too few (``similarity_undersampled_<suffix>``, :func:`undersampled`)."""
    values = list(found.values())
    n_tokens = min(s.n_tokens for s in values)
    mean = lambda name: sum(getattr(s, name) for s in values) / len(values)  # noqa: E731
    return {
        f"linear_cka_{suffix}": mean("linear_cka"),
        f"mean_cca_{suffix}": mean("mean_cca"),
        f"pwcca_{suffix}": mean("pwcca"),
        f"similarity_tokens_{suffix}": n_tokens,
        f"similarity_undersampled_{suffix}": undersampled(n_tokens, hidden_size),
    }
