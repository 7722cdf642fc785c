"""Least-squares statistics kept apart by folds of whole calibration sequences.

Tokens of one sequence are correlated, so a held-out check of a fitted transform is honest only
when the tokens it is checked on come from other sequences than those it was fitted on. Sequence
``j`` (in the order the capture sees them: batch by batch, each batch's sequences in order) goes to
fold ``j % folds``. Each fold's :class:`LinearStats` is accumulated exactly as
:class:`LinearStatistics` accumulates all tokens (same token rule, same placement, same precision,
the rule's per-sequence medians unchanged by the split); the statistics of all tokens are their sum
(:class:`FoldedStats`), so a job needs one capture for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replaceme_exp.capture.entry import StoredValue
from replaceme_exp.capture.statistics import BatchTokens, Cut, LinearStatistics, LinearStats, Request
from replaceme_exp.capture.token_rules import TokenRule

FOLD_ASSIGNMENT = "sequence-index-mod-folds"  # how sequences are dealt to folds (part of the cache key)


@dataclass
class FoldedStats(LinearStats):
    """The statistics of all tokens (the sum of ``folds``, in fold order) and each fold's own:
    ``folds`` is a tuple of :class:`LinearStats` over disjoint sets of whole sequences."""

    folds: tuple[LinearStats, ...] = ()

    @classmethod
    def of(cls, folds: list[LinearStats]) -> "FoldedStats":
        """The sum of ``folds`` (same cut), with the folds kept."""
        first = folds[0]
        mtm, mtr = first.mtm.clone(), first.mtr.clone()
        r_sq, n_tokens = first.r_sq, first.n_tokens
        for fold in folds[1:]:
            mtm += fold.mtm
            mtr += fold.mtr
            r_sq += fold.r_sq
            n_tokens += fold.n_tokens
        return cls(first.cut, mtm, mtr, r_sq, n_tokens, tuple(folds))

    def to(self, device) -> "FoldedStats":
        return FoldedStats.of([fold.to(device) for fold in self.folds])


@dataclass
class StoredFoldedStats(StoredValue):
    """The cache entry of ``cut``'s statistics per fold of whole sequences (``folds`` of them), a kind of
    its own (never served for, nor from, the plain ``linear`` entries); the other fields as
    :class:`~replaceme_exp.capture.statistics.StoredLinearStats`'s."""

    kind: ClassVar[str] = "linear_folds"
    version: ClassVar[int] = 1

    cut: Cut
    folds: int
    placement: str = "fused"
    tokens: str = "all"
    precision: str = "float64"
    value: FoldedStats | None = None

    @classmethod
    def of(cls, stats: FoldedStats, *settings: str) -> "StoredFoldedStats":
        """The entry holding ``stats``, under ``settings`` (placement, tokens, precision)."""
        return cls(stats.cut, len(stats.folds), *settings, value=stats)

    def identity(self) -> dict:
        what = {"cut": list(self.cut), "placement": self.placement, "tokens": self.tokens}
        return {**what, "precision": self.precision, "folds": self.folds, "assignment": FOLD_ASSIGNMENT}

    def state(self) -> dict[str, torch.Tensor]:
        folds = self.value.folds
        return {
            "mtm": torch.stack([f.mtm.cpu() for f in folds]),
            "mtr": torch.stack([f.mtr.cpu() for f in folds]),
            "r_sq": torch.tensor([f.r_sq for f in folds], dtype=torch.float64),
            "n_tokens": torch.tensor([f.n_tokens for f in folds]),
        }

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        parts = [
            LinearStats(self.cut, state["mtm"][i], state["mtr"][i], float(state["r_sq"][i]), int(state["n_tokens"][i]))
            for i in range(self.folds)
        ]
        self.value = FoldedStats.of(parts)


def fold_rows(tokens: BatchTokens, first_sequence: int, folds: int, fold: int) -> tuple[torch.Tensor, BatchTokens]:
    """The rows of one batch's flattened (n_tokens, hidden) activations that belong to ``fold``
    (the batch's sequences are numbered from ``first_sequence``), and the token bookkeeping of
    those rows as a batch of their own. Returns (row indices (n,), :class:`BatchTokens`)."""
    ends = tokens.last_rows.tolist()
    starts = [0] + [end + 1 for end in ends[:-1]]
    chosen = [(s, e) for i, (s, e) in enumerate(zip(starts, ends)) if (first_sequence + i) % folds == fold]
    device = tokens.last_rows.device
    if not chosen:
        return torch.zeros(0, dtype=torch.long, device=device), BatchTokens(0, torch.zeros(0, dtype=torch.long))
    rows = torch.cat([torch.arange(s, e + 1, device=device) for s, e in chosen])
    lengths = torch.tensor([e - s + 1 for s, e in chosen], device=device)
    positions = tokens.positions[rows] if tokens.positions is not None else None
    return rows, BatchTokens(int(lengths.sum()), lengths.cumsum(0) - 1, positions)


class FoldedLinearStatistics:
    """:class:`LinearStatistics` per fold of whole sequences (see the module docstring); same
    arguments plus ``folds`` (>= 2). :meth:`result` gives a :class:`FoldedStats` per cut."""

    takes_padding = False  # padded rows carry no sequence: refused with estimation.padded_positions
    first_sequence = 0  # the index of the first sequence captured (a rank's block of batches starts later)

    def __init__(
        self,
        cuts: list[Cut],
        hidden_size: int,
        device: torch.device,
        placement: str = "fused",
        rule: TokenRule | None = None,
        precision: str = "float64",
        folds: int = 5,
    ):
        if folds < 2:
            raise ValueError(f"folds={folds}: a held-out fold needs at least 2")
        if rule is not None and rule.padded_positions:
            raise ValueError("padded positions belong to no sequence: they cannot be dealt to folds")
        self.cuts, self.n_folds = list(cuts), folds
        self.folds = [LinearStatistics(cuts, hidden_size, device, placement, rule, precision) for _ in range(folds)]

    def requests(self) -> list[Request]:
        per_fold = [fold.requests() for fold in self.folds]
        out = []
        for index, (keys, _) in enumerate(per_fold[0]):
            updates = [requests[index][1] for requests in per_fold]
            out.append((keys, self._updater(updates)))
        return out

    def _updater(self, updates):
        seen = [self.first_sequence]  # sequences this request has seen in earlier batches

        def update(acts: dict, tokens: BatchTokens) -> None:
            for fold, fold_update in enumerate(updates):
                rows, fold_tokens = fold_rows(tokens, seen[0], self.n_folds, fold)
                if fold_tokens.n_tokens:
                    fold_update({key: value[rows.to(value.device)] for key, value in acts.items()}, fold_tokens)
            seen[0] += int(tokens.last_rows.numel())

        return update

    def result(self) -> dict[Cut, FoldedStats]:
        per_fold = [fold.result() for fold in self.folds]
        return {cut: FoldedStats.of([stats[cut] for stats in per_fold]) for cut in self.cuts}


def linear_statistics(cuts, hidden: int, device, placement: str, rule: TokenRule, precision: str, folds: int = 0):
    """The accumulator of the LS statistics of ``cuts``: over all tokens, or per fold of whole
    sequences (``folds`` >= 2)."""
    if folds:
        return FoldedLinearStatistics(cuts, hidden, device, placement, rule, precision, folds)
    return LinearStatistics(cuts, hidden, device, placement, rule, precision)
