"""Streaming statistics over the non-padding tokens of a capture.

Activation keys: ``("L", k)`` is the output of block ``k`` (``L_k``), ``("M", k)`` the output of
its MLP (``M_k``). The post-attention residual is ``Y_k = L_k - M_k``. A cut ``(start, end)``
removes blocks ``start..end-1``; it compares ``L_{start-1}`` with ``L_{end-1}`` and maps
``M_{start-1}`` onto ``L_{end-1} - Y_{start-1}``.

Each statistic exposes ``requests()``: a list of ``(keys, update)`` pairs. The runner calls
``update(acts, tokens)`` once per batch as soon as all ``keys`` of that pair are available, with
``acts[key]`` of shape (n_tokens_in_batch, hidden) holding only non-padding tokens (a statistic
whose ``takes_padding`` is true also gets the padded positions' rows, after them: the official
code's statistics of padded batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F

from replaceme_exp.capture.entry import StoredValue
from replaceme_exp.capture.token_rules import TokenRule, kept, massive_tokens

Cut = tuple[int, int]
PLACEMENTS = ("fused", "separate")
ActKey = tuple[str, int]
Request = tuple[tuple[ActKey, ...], Callable[[dict, "BatchTokens"], None]]


@dataclass
class BatchTokens:
    """Token bookkeeping of one batch: ``last_rows`` (batch,) are the row indices, in the
    flattened (n_tokens, hidden) activations, of each sequence's last non-padding token;
    ``positions`` (n_tokens,) each token's position in its sequence (0 = first)."""

    n_tokens: int
    last_rows: torch.Tensor
    positions: torch.Tensor | None = None


def cut_keys(cut: Cut, with_mlp: bool) -> tuple[ActKey, ...]:
    start, end = cut
    keys: tuple[ActKey, ...] = (("L", start - 1), ("L", end - 1))
    return (("M", start - 1),) + keys if with_mlp else keys


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row ``1 - cos(a, b)`` in float32; (n, d), (n, d) -> (n,)."""
    return 1.0 - F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12)


def sequence_sums(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each sequence's sum of ``values`` (n,) over its ``lengths`` (batch,) consecutive rows: (batch,), on the CPU."""
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=values.device), lengths.to(values.device))
    return values.new_zeros(len(lengths)).index_add_(0, sequence, values).cpu()


class CutDistances:
    """Mean per-token distance between ``L_{start-1}`` and ``L_{end-1}`` for every cut.

    ``distance``: a per-token distance, (n, d), (n, d) -> (n,) (the selection metric's; default the
    paper's ``1 - cos``). ``tokens``: ``all`` non-padding tokens or each sequence's ``last``.
    ``sequence_distance``: instead, one distance per sequence, (n_i, d), (n_i, d) -> (), averaged
    over sequences (every sequence counts once, whatever its length). ``per_sequence``: also keep,
    for every cut, each sequence's share of the sum (``sequence_values[cut]``: a float64 tensor per
    batch, (batch,): the sum of the sequence's token distances, its last token's distance, or its
    sequence distance), what :class:`~replaceme_exp.selection.race.CandidateRace` compares.
    """

    takes_padding = False  # padded positions are not data: never compared

    def __init__(
        self,
        cuts: list[Cut],
        distance: Callable = cosine_distance,
        tokens: str = "all",
        sequence_distance: Callable | None = None,
        per_sequence: bool = False,
    ):
        if tokens not in ("all", "last"):
            raise ValueError(f"selection.tokens={tokens!r}: choose all or last")
        self.cuts, self.distance, self.tokens = list(cuts), distance, tokens
        self.sequence_distance = sequence_distance
        self.sums = {cut: 0.0 for cut in self.cuts}
        self.counts = {cut: 0 for cut in self.cuts}
        self.sequence_values: dict[Cut, list[torch.Tensor]] | None = (
            {cut: [] for cut in self.cuts} if per_sequence else None
        )

    def requests(self) -> list[Request]:
        return [(cut_keys(cut, with_mlp=False), self._updater(cut)) for cut in self.cuts]

    def _updater(self, cut: Cut):
        before, after = cut_keys(cut, with_mlp=False)

        def update(acts: dict, tokens: BatchTokens) -> None:
            a, b = acts[before], acts[after]
            ends = tokens.last_rows.long() + 1
            lengths = torch.diff(ends, prepend=ends.new_zeros(1))
            if self.sequence_distance is not None:
                values = []
                for x, y in zip(a.split(lengths.tolist()), b.split(lengths.tolist())):
                    if x.shape[0]:
                        values.append(float(self.sequence_distance(x, y)))
                        self.sums[cut] += values[-1]
                        self.counts[cut] += 1
                self._keep_sequences(cut, lambda: torch.tensor(values, dtype=torch.float64))
                return
            if self.tokens == "last":
                a, b = a[tokens.last_rows], b[tokens.last_rows]
            dist = self.distance(a, b).double()
            self.sums[cut] += float(dist.sum())
            self.counts[cut] += dist.numel()
            if self.tokens == "last":
                self._keep_sequences(cut, lambda: dist.cpu())
            else:
                self._keep_sequences(cut, lambda: sequence_sums(dist, lengths))

        return update

    def _keep_sequences(self, cut: Cut, values: Callable[[], torch.Tensor]) -> None:
        if self.sequence_values is not None:
            self.sequence_values[cut].append(values())

    def result(self) -> dict[Cut, float]:
        return {cut: self.sums[cut] / max(self.counts[cut], 1) for cut in self.cuts}


class LayerDistances:
    """Mean cosine distance between the outputs of every pair of blocks over all non-padding
    tokens: ``result()[i][j]`` = mean_t (1 - cos(L_i[t], L_j[t])), an (L, L) symmetric list of
    lists with a zero diagonal (the paper's layer-distance heatmap).

    Per batch the unit-normalised outputs are stacked in chunks of ``chunk_tokens`` tokens, so
    the extra memory is L x chunk_tokens x hidden floats, and one matmul gives every pair.
    """

    takes_padding = False  # padded positions are not data: never compared

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
class StoredDistances(StoredValue):
    """The cache entry of a selection's distances, ``{cut: distance}``, over every candidate cut of
    ``length`` blocks under ``criterion`` (e.g. ``cosine/all``, ``ls_residual/alpha=0.0``)."""

    kind: ClassVar[str] = "distances"
    version: ClassVar[int] = 2

    length: int
    criterion: str
    value: dict[Cut, float] | None = None

    def identity(self) -> dict:
        return {"length": self.length, "criterion": self.criterion}

    def state(self) -> dict[str, torch.Tensor]:
        cuts = sorted(self.value)
        distances = torch.tensor([self.value[c] for c in cuts], dtype=torch.float64)
        return {"cuts": torch.tensor(cuts), "distances": distances}

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        pairs = zip(state["cuts"].tolist(), state["distances"].tolist())
        self.value = {tuple(c): d for c, d in pairs}


@dataclass
class StoredLayerDistances(StoredValue):
    """The cache entry of :class:`LayerDistances`' (num_layers, num_layers) mean cosine distances."""

    kind: ClassVar[str] = "layer_distances"
    version: ClassVar[int] = 2

    value: list[list[float]] | None = None

    def identity(self) -> dict:
        return {}

    def state(self) -> dict[str, torch.Tensor]:
        return {"distances": torch.tensor(self.value, dtype=torch.float64)}

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        self.value = state["distances"].tolist()


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


@dataclass
class StoredLinearStats(StoredValue):
    """The cache entry of ``cut``'s :class:`LinearStats` in ``placement`` over the tokens ``tokens``
    selects (:meth:`TokenRule.key`), products taken in ``precision``."""

    kind: ClassVar[str] = "linear"
    version: ClassVar[int] = 2

    cut: Cut
    placement: str = "fused"
    tokens: str = "all"
    precision: str = "float64"
    value: LinearStats | None = None

    @classmethod
    def of(cls, stats: LinearStats, *settings: str) -> "StoredLinearStats":
        """The entry holding ``stats``, under ``settings`` (placement, tokens, precision)."""
        return cls(stats.cut, *settings, value=stats)

    def identity(self) -> dict:
        what = {"cut": list(self.cut), "placement": self.placement, "tokens": self.tokens}
        if self.precision != "float64":  # float64 entries keep the key they had before precisions existed
            what["precision"] = self.precision
        return what

    def state(self) -> dict[str, torch.Tensor]:
        v = self.value
        return {
            "mtm": v.mtm.cpu(),
            "mtr": v.mtr.cpu(),
            "r_sq": torch.tensor(v.r_sq, dtype=torch.float64),
            "n_tokens": torch.tensor(v.n_tokens),
        }

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        self.value = LinearStats(self.cut, state["mtm"], state["mtr"], float(state["r_sq"]), int(state["n_tokens"]))


PRECISIONS = ("float64", "float32")


def add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor, precision: str) -> None:
    """``total += a^T b`` for (n, d) inputs and a float64 (d, d) ``total``: the product in float64,
    or (``precision="float32"``, for GPUs with slow FP64) in float32 per batch and added to the
    float64 total, so rounding does not grow with the number of batches."""
    if precision == "float64":
        total.addmm_(a.T, b)
    else:
        total.add_(torch.mm(a.T, b).to(torch.float64))


def gram_blocks(width: int) -> int:
    """How many row blocks :func:`add_gram` splits a Gram of ``width`` columns into: blocks of at
    least 128 columns (narrower products run below the BLAS's speed), at most 16."""
    return max(1, min(width // 128, 16))


def add_gram(total: torch.Tensor, x: torch.Tensor, precision: str, blocks: int | None = None) -> None:
    """The lower triangle of ``total += x^T x`` for an (n, d) ``x`` and a float64 (d, d) ``total``
    (products as :func:`add_product`): row block i of ``blocks`` (default :func:`gram_blocks`) takes
    the columns up to its own end, (blocks + 1) / (2 blocks) of the full product's work. Above the
    diagonal blocks ``total`` is left as it was: :func:`symmetrize` fills it."""
    d = x.shape[1]
    k = blocks or gram_blocks(d)
    edges = [round(i * d / k) for i in range(k + 1)]
    for lo, hi in zip(edges, edges[1:]):
        add_product(total[lo:hi, :hi], x[:, lo:hi], x[:, :hi], precision)


def symmetrize(total: torch.Tensor) -> torch.Tensor:
    """``total`` (d, d) made symmetric in place from its lower triangle (what :func:`add_gram`
    accumulates); returns it."""
    total.copy_(total.tril() + total.tril(-1).T)
    return total


class LinearStatistics:
    """Accumulates :class:`LinearStats` in float64 for every requested cut. Cuts sharing a start
    share one ``M^T M`` (unless the token rule depends on the cut's end); each batch's input is
    converted once per start: to float64, or with ``precision="float32"`` to float32, each
    batch's products then being summed in float64 (:func:`add_product`). ``mtm`` holds the lower
    triangle of each ``M^T M`` (:func:`add_gram`) until :meth:`result` makes it symmetric.

    ``placement="fused"``: input ``M_{start-1}``, target ``L_{end-1} - Y_{start-1}`` (T fused into
    the down-projection). ``placement="separate"``: input ``L_{start-1}``, target ``L_{end-1}``
    (T as its own module on the full block output). ``rule``: which tokens enter
    (:class:`~replaceme_exp.capture.token_rules.TokenRule`; default all). ``keeps``: asked before
    each batch's update of a cut whether its statistics are still wanted (None: always); a cut it
    answers no for once is dropped (``dropped``): never updated again, and left out of
    :meth:`result`, so no partial statistics leave the accumulator.
    """

    def __init__(
        self,
        cuts: list[Cut],
        hidden_size: int,
        device: torch.device,
        placement: str = "fused",
        rule: TokenRule | None = None,
        precision: str = "float64",
        keeps: Callable[[Cut], bool] | None = None,
    ):
        if placement not in PLACEMENTS:
            raise ValueError(f"lt_placement={placement!r}: choose one of {PLACEMENTS}")
        if precision not in PRECISIONS:
            raise ValueError(f"capture.precision={precision!r}: choose one of {PRECISIONS}")
        self.cuts, self.placement, self.rule = list(cuts), placement, rule or TokenRule()
        self.keeps, self.dropped = keeps, set()
        self.takes_padding = self.rule.padded_positions
        self.precision = precision
        self.dtype = torch.float64 if precision == "float64" else torch.float32
        self.by_start: dict[int, list[Cut]] = {}
        for cut in self.cuts:
            self.by_start.setdefault(cut[0], []).append(cut)
        zeros = lambda: torch.zeros(hidden_size, hidden_size, dtype=torch.float64, device=device)  # noqa: E731
        groups = self.cuts if self.rule.per_cut else list(self.by_start)
        self.mtm = {group: zeros() for group in groups}
        self.n_tokens = {group: 0 for group in groups}
        self.mtr = {cut: zeros() for cut in self.cuts}
        self.r_sq = {cut: 0.0 for cut in self.cuts}

    def _group(self, cut: Cut):
        return cut if self.rule.per_cut else cut[0]

    def requests(self) -> list[Request]:
        out = []
        for start, cuts in self.by_start.items():
            keys = {("L", start - 1)} | {("L", end - 1) for _, end in cuts}
            if self.placement == "fused":
                keys.add(("M", start - 1))
            out.append((tuple(sorted(keys)), self._updater(start, cuts)))
        return out

    def _accumulate_input(self, group, x: torch.Tensor) -> None:
        add_gram(self.mtm[group], x, self.precision)
        self.n_tokens[group] += x.shape[0]

    def _entering(self, act: torch.Tensor, mask) -> torch.Tensor:
        """The rows of ``act`` that enter under ``mask``: scaled ones in the statistics' dtype;
        selected or all ones as they are when that dtype holds theirs (the arithmetic that takes
        them converts them exactly, without a converted copy)."""
        if (mask is not None and mask.dtype != torch.bool) or torch.promote_types(act.dtype, self.dtype) != self.dtype:
            return kept(act.to(self.dtype), mask)
        return kept(act, mask)

    def _inputs(self, acts: dict, start: int, mask) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(M in the statistics' dtype, Y_{start-1} or None) of the tokens ``mask`` keeps: M is
        M_{start-1} (fused) or L_{start-1} (separate)."""
        prev = self._entering(acts[("L", start - 1)], mask)
        if self.placement == "fused":
            x = self._entering(acts[("M", start - 1)], mask).to(self.dtype)
            return x, torch.sub(prev, x)  # Y_{start-1}, in the statistics' dtype
        return prev.to(self.dtype), None

    def _updater(self, start: int, cuts: list[Cut]):
        def update(acts: dict, tokens: BatchTokens) -> None:
            if self.keeps is not None:
                self.dropped.update(cut for cut in cuts if cut not in self.dropped and not self.keeps(cut))
                if all(cut in self.dropped for cut in cuts):
                    return
            prev = acts[("L", start - 1)]
            shared = None if self.rule.per_cut else self.rule.keep(tokens, prev)
            inputs = None
            for cut in (cut for cut in cuts if cut not in self.dropped):
                after = acts[("L", cut[1] - 1)]
                mask = self.rule.keep(tokens, prev, after) if self.rule.per_cut else shared
                if self.rule.per_cut or inputs is None:
                    inputs = self._inputs(acts, start, mask)
                    self._accumulate_input(self._group(cut), inputs[0])
                x, base = inputs
                r = self._entering(after, mask)
                r = torch.sub(r, base) if base is not None else r.to(self.dtype)
                add_product(self.mtr[cut], x, r, self.precision)
                flat = r.reshape(-1).double()
                self.r_sq[cut] += float(torch.dot(flat, flat))

        return update

    def result(self) -> dict[Cut, LinearStats]:
        """Every cut's statistics but the dropped ones'."""
        for mtm in self.mtm.values():
            symmetrize(mtm)
        out = {}
        for cut in (cut for cut in self.cuts if cut not in self.dropped):
            group = self._group(cut)
            out[cut] = LinearStats(cut, self.mtm[group], self.mtr[cut], self.r_sq[cut], self.n_tokens[group])
        return out


SPLITS = ("sink", "rest")


class TransformDistances:
    """Held-out check of estimated transforms: for each cut, the mean cosine distance between
    the target ``L_{end-1}`` and what block ``end`` now receives, without T (``L_{start-1}``)
    and with T (``Y_{start-1} + M_{start-1} T`` fused, ``L_{start-1} T`` separate); and the mean
    Euclidean distance without T (the block-selection figure's L2 axis). The same distances are
    kept apart for the sink tokens (massive at ``L_{start-1}`` or ``L_{end-1}``: norm above
    ``sink_threshold`` times the median of its sequence, :func:`massive_tokens`) and the rest."""

    takes_padding = False  # padded positions are not data: never compared

    def __init__(
        self, transforms: dict[Cut, torch.Tensor | None], placement: str | dict[Cut, str] = "fused", sink_threshold=20.0
    ):
        self.transforms, self.sink_threshold = dict(transforms), float(sink_threshold)
        # by cut: a composed cut's T maps the whole block output (``placement`` given per cut)
        self.placements = placement if isinstance(placement, dict) else {cut: placement for cut in self.transforms}
        self.before = {cut: 0.0 for cut in self.transforms}
        self.l2_before = {cut: 0.0 for cut in self.transforms}
        self.after = {cut: 0.0 for cut in self.transforms}
        self.counts = {cut: 0 for cut in self.transforms}
        # split -> [sum before, sum after, count] over all cuts
        self.splits = {split: [0.0, 0.0, 0] for split in SPLITS}

    def requests(self) -> list[Request]:
        return [(cut_keys(cut, with_mlp=True), self._updater(cut)) for cut in self.transforms]

    def _updater(self, cut: Cut):
        m_key, prev_key, target_key = cut_keys(cut, with_mlp=True)
        transform = self.transforms[cut]

        def update(acts: dict, tokens: BatchTokens) -> None:
            m, prev, target = acts[m_key].float(), acts[prev_key].float(), acts[target_key].float()
            if transform is None:
                received = prev
            elif self.placements[cut] == "separate":
                received = prev @ transform.to(device=m.device, dtype=torch.float32)
            else:
                received = prev - m + m @ transform.to(device=m.device, dtype=torch.float32)
            before = cosine_distance(prev, target).double()
            after = cosine_distance(received, target).double()
            self.before[cut] += float(before.sum())
            self.l2_before[cut] += float((prev - target).norm(dim=-1).double().sum())
            self.after[cut] += float(after.sum())
            self.counts[cut] += m.shape[0]
            sink = massive_tokens((prev, target), tokens.last_rows, self.sink_threshold)
            for split, mask in (("sink", sink), ("rest", ~sink)):
                totals = self.splits[split]
                totals[0] += float(before[mask].sum())
                totals[1] += float(after[mask].sum())
                totals[2] += int(mask.sum())

        return update

    def result(self) -> tuple[float, float]:
        """Token-weighted mean over all cuts of (distance without T, distance with T)."""
        total = sum(self.counts.values())
        return sum(self.before.values()) / total, sum(self.after.values()) / total

    def l2_result(self) -> float:
        """Token-weighted mean over all cuts of ||L_{end-1} - L_{start-1}|| (without T)."""
        return sum(self.l2_before.values()) / sum(self.counts.values())

    def split_result(self) -> dict[str, float | None]:
        """Row columns: ``cos_dist_{before,after}_{sink,rest}`` (None when no token of the split)
        and ``heldout_sink_fraction``, the sinks' share of the checked (cut, token) pairs."""
        return split_columns([self])


def split_columns(checks: list[TransformDistances]) -> dict[str, float | None]:
    """:meth:`TransformDistances.split_result` over several checks (the stages of a sequential job)."""
    out: dict[str, float | None] = {}
    counts = {}
    for split in SPLITS:
        before = sum(c.splits[split][0] for c in checks)
        after = sum(c.splits[split][1] for c in checks)
        counts[split] = n = sum(c.splits[split][2] for c in checks)
        out[f"cos_dist_before_{split}"] = before / n if n else None
        out[f"cos_dist_after_{split}"] = after / n if n else None
    total = sum(counts.values())
    out["heldout_sink_fraction"] = counts["sink"] / total if total else None
    return out


class TokenCollector:
    """Writes what one cut's numerical objective needs into a :class:`TokenStore`, token by
    token: ``M`` = M_{start-1} and ``R`` = L_{end-1} - Y_{start-1}, plus ``Y`` = Y_{start-1}
    when the store has it (the exact cosine objective). For the separate placement ``M`` is
    L_{start-1}, ``R`` is L_{end-1} and ``Y`` is 0. Only the tokens ``rule`` keeps are written;
    ``offset`` ends as the number written."""

    def __init__(self, cut: Cut, store, placement: str = "fused", rule: TokenRule | None = None):
        self.cut, self.store, self.offset, self.placement = cut, store, 0, placement
        self.rule = rule or TokenRule()
        self.takes_padding = self.rule.padded_positions

    def requests(self) -> list[Request]:
        m_key, prev_key, target_key = cut_keys(self.cut, with_mlp=True)

        def update(acts: dict, tokens: BatchTokens) -> None:
            mask = self.rule.keep(tokens, acts[prev_key], acts[target_key])
            scaled = mask is not None and mask.dtype != torch.bool  # scale in float32, then store
            m, prev, target = (
                kept(acts[key].float() if scaled else acts[key], mask) for key in (m_key, prev_key, target_key)
            )
            if self.placement == "separate":  # T maps the whole block output: "M" = L_{start-1}
                m, y = prev, torch.zeros_like(prev)
            else:  # in float64: R = L - (prev - M) cancels; the store rounds it once
                y = prev.double() - m.double()
            self.store.write("M", self.offset, m)
            self.store.write("R", self.offset, target.double() - y)
            if "Y" in self.store.names:
                self.store.write("Y", self.offset, y)
            self.offset += m.shape[0]

        return [(cut_keys(self.cut, with_mlp=True), update)]
