"""How each statistic of a capture merges across the ranks that split its batches
(:mod:`replaceme_exp.capture.distributed`), so that every rank ends with the statistic of all batches.

- sums (``M^T M``, ``M^T R``, moments, cosine sums) are summed over the ranks in float64
  (``all_reduce(SUM)``), token and sequence counts as integers;
- a mean is never averaged: its (sum, count) pair is summed and divided afterwards, as the
  statistic's ``result`` already does;
- a token store is gathered on rank 0 in rank order: each rank's rows go after those of the ranks
  before it, so the store holds the tokens in batch order, as the one-process store does (the other
  ranks keep only their own rows: they fit nothing).

Only the rounding of the sums' order differs from a one-process capture. A statistic without a merge
cannot be split: :func:`merge` says so instead of returning one rank's share.
"""

from __future__ import annotations

import dataclasses
from functools import singledispatch

from replaceme_exp.capture import distributed
from replaceme_exp.capture.accumulator import Accumulator
from replaceme_exp.capture.folds import FoldedLinearStatistics
from replaceme_exp.capture.similarity import SimilarityStatistics
from replaceme_exp.capture.statistics import (
    SPLITS,
    CutDistances,
    LayerDistances,
    LinearStatistics,
    TokenCollector,
    TransformDistances,
)


def capture_shared(batches, statistics: list, capture, desc: str = "capture"):
    """This rank's share of a capture split over the ranks: ``capture(mine, label)`` runs the
    statistics over this rank's block of consecutive ``batches`` (a :class:`TokenBatches`; ``label``:
    ``desc`` and the rank), then every statistic is merged. Returns what ``capture`` returns."""
    ranks = distributed.shared()
    mine, sequences_before = distributed.shard(batches.batches, ranks)
    for statistic in statistics:
        if hasattr(statistic, "first_sequence"):  # folds deal sequences by their index over all batches
            statistic.first_sequence = sequences_before
    distributed.injected_fault(ranks)
    found = capture(dataclasses.replace(batches, batches=mine), f"{desc} {ranks.label}")
    merge_all(statistics)
    return found


def merge_all(statistics: list) -> None:
    """Merge every statistic of a capture across the ranks, in the same order on every rank."""
    for statistic in statistics:
        merge(statistic)


@singledispatch
def merge(statistic) -> None:
    """Make ``statistic`` (this rank's share) the statistic of every rank's batches."""
    raise TypeError(f"{type(statistic).__name__} has no merge across ranks: it cannot be captured by several ranks")


def _sum_tensors(tensors: dict) -> None:
    for key in sorted(tensors, key=repr):
        distributed.all_reduce_sum(tensors[key])


def _sum_values(values: dict) -> None:
    keys = sorted(values, key=repr)
    for key, total in zip(keys, distributed.sum_numbers([values[k] for k in keys])):
        values[key] = total


@merge.register
def _(statistic: CutDistances) -> None:
    _sum_values(statistic.sums)
    _sum_values(statistic.counts)


@merge.register
def _(statistic: LayerDistances) -> None:
    distributed.all_reduce_sum(statistic.cos_sum)
    statistic.n_tokens = distributed.sum_numbers([int(statistic.n_tokens)])[0]


@merge.register
def _(statistic: LinearStatistics) -> None:
    _sum_tensors(statistic.mtm)
    _sum_tensors(statistic.mtr)
    _sum_values(statistic.r_sq)
    _sum_values(statistic.n_tokens)


@merge.register
def _(statistic: FoldedLinearStatistics) -> None:
    for fold in statistic.folds:
        merge(fold)


@merge.register
def _(statistic: SimilarityStatistics) -> None:
    _sum_tensors(statistic.sums)
    _sum_tensors(statistic.grams)
    _sum_tensors(statistic.cross)
    _sum_values(statistic.counts)


@merge.register
def _(statistic: Accumulator) -> None:
    statistic.merge()


@merge.register
def _(statistic: TransformDistances) -> None:
    for sums in (statistic.before, statistic.l2_before, statistic.after, statistic.counts):
        _sum_values(sums)
    for split in SPLITS:
        totals = statistic.splits[split]
        totals[:2] = distributed.sum_numbers([float(v) for v in totals[:2]])
        totals[2] = distributed.sum_numbers([int(totals[2])])[0]


@merge.register
def _(statistic: TokenCollector) -> None:
    counts = distributed.counts_of_ranks(statistic.offset)
    for name in statistic.store.names:
        distributed.rows_to_leader(statistic.store.tensors[name], counts)
    statistic.offset = sum(counts)
