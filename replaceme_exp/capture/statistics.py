"""Streaming statistics over the non-padding tokens of a capture.

Activation keys: ``("L", k)`` is the output of block ``k`` (``L_k``), ``("M", k)`` the output of
its MLP (``M_k``). The post-attention residual is ``Y_k = L_k - M_k``. A cut ``(start, end)``
removes blocks ``start..end-1``; it compares ``L_{start-1}`` with ``L_{end-1}`` and maps
``M_{start-1}`` onto ``L_{end-1} - Y_{start-1}``.

Each statistic exposes ``requests()``: a list of ``(keys, update)`` pairs. The runner calls
``update(acts, tokens)`` once per batch as soon as all ``keys`` of that pair are available, with
``acts[key]`` of shape (n_tokens_in_batch, hidden) holding only non-padding tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

Cut = tuple[int, int]
PLACEMENTS = ("fused", "separate")
ActKey = tuple[str, int]
Request = tuple[tuple[ActKey, ...], Callable[[dict, "BatchTokens"], None]]


@dataclass
class BatchTokens:
    """Token bookkeeping of one batch: ``last_rows`` (batch,) are the row indices, in the
    flattened (n_tokens, hidden) activations, of each sequence's last non-padding token."""

    n_tokens: int
    last_rows: torch.Tensor


def cut_keys(cut: Cut, with_mlp: bool) -> tuple[ActKey, ...]:
    start, end = cut
    keys: tuple[ActKey, ...] = (("L", start - 1), ("L", end - 1))
    return (("M", start - 1),) + keys if with_mlp else keys


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row ``1 - cos(a, b)`` in float32; (n, d), (n, d) -> (n,)."""
    return 1.0 - F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12)


DISTANCE_METRICS = ("cosine", "angular", "l2")


class CutDistances:
    """Mean distance between ``L_{start-1}`` and ``L_{end-1}`` for every cut.

    ``metric``: ``cosine`` (1 - cos, the paper's criterion), ``angular`` (arccos(cos)/pi, the
    UIDL criterion of Gromov et al.) or ``l2`` (Euclidean norm of the difference, the paper's
    block-selection appendix). ``tokens``: ``all`` non-padding tokens or each sequence's ``last``.
    """

    def __init__(self, cuts: list[Cut], metric: str = "cosine", tokens: str = "all"):
        if metric not in DISTANCE_METRICS:
            raise ValueError(f"selection.metric={metric!r}: choose one of {DISTANCE_METRICS}")
        if tokens not in ("all", "last"):
            raise ValueError(f"selection.tokens={tokens!r}: choose all or last")
        self.cuts, self.metric, self.tokens = list(cuts), metric, tokens
        self.sums = {cut: 0.0 for cut in self.cuts}
        self.counts = {cut: 0 for cut in self.cuts}

    def requests(self) -> list[Request]:
        return [(cut_keys(cut, with_mlp=False), self._updater(cut)) for cut in self.cuts]

    def _distance(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.metric == "l2":
            return (a.float() - b.float()).norm(dim=-1)
        if self.metric == "angular":
            cos = F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12).clamp(-1.0, 1.0)
            return torch.arccos(cos) / math.pi
        return cosine_distance(a, b)

    def _updater(self, cut: Cut):
        before, after = cut_keys(cut, with_mlp=False)

        def update(acts: dict, tokens: BatchTokens) -> None:
            a, b = acts[before], acts[after]
            if self.tokens == "last":
                a, b = a[tokens.last_rows], b[tokens.last_rows]
            dist = self._distance(a, b)
            self.sums[cut] += float(dist.double().sum())
            self.counts[cut] += dist.numel()

        return update

    def result(self) -> dict[Cut, float]:
        return {cut: self.sums[cut] / max(self.counts[cut], 1) for cut in self.cuts}


class LayerDistances:
    """Mean cosine distance between the outputs of every pair of blocks over all non-padding
    tokens: ``result()[i][j]`` = mean_t (1 - cos(L_i[t], L_j[t])), an (L, L) symmetric list of
    lists with a zero diagonal (the paper's layer-distance heatmap).

    Per batch the unit-normalised outputs are stacked in chunks of ``chunk_tokens`` tokens, so
    the extra memory is L x chunk_tokens x hidden floats, and one matmul gives every pair.
    """

    def __init__(self, num_layers: int, chunk_tokens: int = 1024):
        self.num_layers, self.chunk_tokens = num_layers, chunk_tokens
        self.cos_sum = torch.zeros(num_layers, num_layers, dtype=torch.float64)
        self.n_tokens = 0

    def requests(self) -> list[Request]:
        return [(tuple(("L", k) for k in range(self.num_layers)), self._update)]

    def _update(self, acts: dict, tokens: BatchTokens) -> None:
        n = acts[("L", 0)].shape[0]
        for lo in range(0, n, self.chunk_tokens):
            unit = torch.stack(
                [
                    F.normalize(acts[("L", k)][lo : lo + self.chunk_tokens].float(), dim=-1, eps=1e-12)
                    for k in range(self.num_layers)
                ]
            ).flatten(1)  # (L, chunk * hidden)
            self.cos_sum += (unit @ unit.T).double().cpu()
        self.n_tokens += n

    def result(self) -> list[list[float]]:
        mean_cos = self.cos_sum / max(self.n_tokens, 1)
        distance = 1.0 - (mean_cos + mean_cos.T) / 2  # exactly symmetric despite float32 matmuls
        distance.fill_diagonal_(0.0)
        return distance.tolist()


@dataclass
class LinearStats:
    """Sufficient statistics of the least-squares problem ``min_T ||M T - R||_F^2`` for one cut,
    with ``M = M_{start-1}`` and ``R = L_{end-1} - Y_{start-1}`` over n_tokens non-padding tokens
    (for the separate placement ``M = L_{start-1}`` and ``R = L_{end-1}``).

    ``mtm`` = M^T M and ``mtr`` = M^T R, (hidden, hidden) float64; ``r_sq`` = ||R||_F^2.
    """

    cut: Cut
    mtm: torch.Tensor
    mtr: torch.Tensor
    r_sq: float
    n_tokens: int

    def to(self, device) -> "LinearStats":
        return LinearStats(self.cut, self.mtm.to(device), self.mtr.to(device), self.r_sq, self.n_tokens)


class LinearStatistics:
    """Accumulates :class:`LinearStats` in float64 for every requested cut. Cuts sharing a start
    share one ``M^T M``; each batch's input is converted to float64 once per start.

    ``placement="fused"``: input ``M_{start-1}``, target ``L_{end-1} - Y_{start-1}`` (T fused into
    the down-projection). ``placement="separate"``: input ``L_{start-1}``, target ``L_{end-1}``
    (T as its own module on the full block output).
    """

    def __init__(self, cuts: list[Cut], hidden_size: int, device: torch.device, placement: str = "fused"):
        if placement not in PLACEMENTS:
            raise ValueError(f"lt_placement={placement!r}: choose one of {PLACEMENTS}")
        self.cuts, self.placement = list(cuts), placement
        self.by_start: dict[int, list[Cut]] = {}
        for cut in self.cuts:
            self.by_start.setdefault(cut[0], []).append(cut)
        zeros = lambda: torch.zeros(hidden_size, hidden_size, dtype=torch.float64, device=device)  # noqa: E731
        self.mtm = {start: zeros() for start in self.by_start}
        self.mtr = {cut: zeros() for cut in self.cuts}
        self.r_sq = {cut: 0.0 for cut in self.cuts}
        self.n_tokens = {start: 0 for start in self.by_start}

    def requests(self) -> list[Request]:
        out = []
        for start, cuts in self.by_start.items():
            keys = {("L", start - 1)} | {("L", end - 1) for _, end in cuts}
            if self.placement == "fused":
                keys.add(("M", start - 1))
            out.append((tuple(sorted(keys)), self._updater(start, cuts)))
        return out

    def _updater(self, start: int, cuts: list[Cut]):
        def update(acts: dict, tokens: BatchTokens) -> None:
            prev = acts[("L", start - 1)].double()
            if self.placement == "fused":
                x = acts[("M", start - 1)].double()
                base = prev - x  # Y_{start-1}
            else:
                x, base = prev, None
            self.mtm[start].addmm_(x.T, x)
            self.n_tokens[start] += x.shape[0]
            for cut in cuts:
                r = acts[("L", cut[1] - 1)].double()
                if base is not None:
                    r = r - base
                self.mtr[cut].addmm_(x.T, r)
                self.r_sq[cut] += float(r.pow(2).sum())

        return update

    def result(self) -> dict[Cut, LinearStats]:
        return {
            cut: LinearStats(cut, self.mtm[cut[0]], self.mtr[cut], self.r_sq[cut], self.n_tokens[cut[0]])
            for cut in self.cuts
        }


class TransformDistances:
    """Held-out check of estimated transforms: for each cut, the mean cosine distance between
    the target ``L_{end-1}`` and what block ``end`` now receives, without T (``L_{start-1}``)
    and with T (``Y_{start-1} + M_{start-1} T`` fused, ``L_{start-1} T`` separate); and the mean
    Euclidean distance without T (the block-selection figure's L2 axis)."""

    def __init__(self, transforms: dict[Cut, torch.Tensor | None], placement: str = "fused"):
        self.transforms, self.placement = dict(transforms), placement
        self.before = {cut: 0.0 for cut in self.transforms}
        self.l2_before = {cut: 0.0 for cut in self.transforms}
        self.after = {cut: 0.0 for cut in self.transforms}
        self.counts = {cut: 0 for cut in self.transforms}

    def requests(self) -> list[Request]:
        return [(cut_keys(cut, with_mlp=True), self._updater(cut)) for cut in self.transforms]

    def _updater(self, cut: Cut):
        m_key, prev_key, target_key = cut_keys(cut, with_mlp=True)
        transform = self.transforms[cut]

        def update(acts: dict, tokens: BatchTokens) -> None:
            m, prev, target = acts[m_key].float(), acts[prev_key].float(), acts[target_key].float()
            if transform is None:
                received = prev
            elif self.placement == "separate":
                received = prev @ transform.to(device=m.device, dtype=torch.float32)
            else:
                received = prev - m + m @ transform.to(device=m.device, dtype=torch.float32)
            self.before[cut] += float(cosine_distance(prev, target).double().sum())
            self.l2_before[cut] += float((prev - target).norm(dim=-1).double().sum())
            self.after[cut] += float(cosine_distance(received, target).double().sum())
            self.counts[cut] += m.shape[0]

        return update

    def result(self) -> tuple[float, float]:
        """Token-weighted mean over all cuts of (distance without T, distance with T)."""
        total = sum(self.counts.values())
        return sum(self.before.values()) / total, sum(self.after.values()) / total

    def l2_result(self) -> float:
        """Token-weighted mean over all cuts of ||L_{end-1} - L_{start-1}|| (without T)."""
        return sum(self.l2_before.values()) / sum(self.counts.values())


class TokenCollector:
    """Writes what one cut's numerical objective needs into a :class:`TokenStore`, token by
    token: ``M`` = M_{start-1} and ``R`` = L_{end-1} - Y_{start-1}, plus ``Y`` = Y_{start-1}
    when the store has it (the exact cosine objective). For the separate placement ``M`` is
    L_{start-1}, ``R`` is L_{end-1} and ``Y`` is 0."""

    def __init__(self, cut: Cut, store, placement: str = "fused"):
        self.cut, self.store, self.offset, self.placement = cut, store, 0, placement

    def requests(self) -> list[Request]:
        m_key, prev_key, target_key = cut_keys(self.cut, with_mlp=True)

        def update(acts: dict, tokens: BatchTokens) -> None:
            m, prev, target = acts[m_key], acts[prev_key], acts[target_key]
            if self.placement == "separate":  # T maps the whole block output: "M" = L_{start-1}
                m, y = prev, torch.zeros_like(prev)
            else:
                y = prev - m
            self.store.write("M", self.offset, m)
            self.store.write("R", self.offset, target - y)
            if "Y" in self.store.names:
                self.store.write("Y", self.offset, y)
            self.offset += m.shape[0]

        return [(cut_keys(self.cut, with_mlp=True), update)]
