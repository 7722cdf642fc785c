"""Which candidate cuts can still be selected while the one-pass capture runs.

The one-pass capture gathers every candidate's LS statistics beside the selection distances, so
that the chosen cut needs no second pass; but a single cut is chosen, and most candidates are out
of the running after a few batches. :class:`CandidateRace` tells the statistics
(:class:`~replaceme_exp.capture.statistics.LinearStatistics`, its ``keeps``) which candidates are
still in: a candidate drops out once its distance is, paired over the same sequences, more than
``z`` standard errors above the leader's. A dropped candidate's statistics are never used (they
miss batches); the distances of every candidate are still measured in full, so the selection is
the same, and should a dropped candidate be selected after all, its statistics are captured in a
second pass (:func:`~replaceme_exp.selection.passes.select_and_capture`). No number changes: the
chosen cut's statistics are the same sums in the same order.
"""

from __future__ import annotations

import math

import torch

from replaceme_exp.capture.statistics import Cut, CutDistances

Z = 5.0  # standard errors above the leader: a one-sided normal tail of 3e-7 per comparison
MIN_SEQUENCES = 16  # sequences seen before any candidate drops out


class CandidateRace:
    """Candidates of ``distances`` (a :class:`CutDistances` kept ``per_sequence``) still able to be
    selected as the single cut of lowest mean distance.

    After every batch that all candidates still in have completed (at least ``min_sequences``
    sequences in all), the leader is the one of lowest summed distance; each other candidate ``c``
    compares its per-sequence values ``x_c`` with the leader's over the same sequences,
    ``D = x_c - x_leader``, and drops out when ``mean(D) > z * std(D) / sqrt(k)`` over the ``k``
    sequences seen. ``dropped``: each dropped cut and the sequences seen when it dropped."""

    def __init__(self, distances: CutDistances, z: float = Z, min_sequences: int = MIN_SEQUENCES):
        if distances.sequence_values is None:
            raise ValueError("CandidateRace needs the distances of each sequence (CutDistances(per_sequence=True))")
        self.distances, self.z, self.min_sequences = distances, float(z), int(min_sequences)
        self.dropped: dict[Cut, int] = {}
        self._decided_batches = 0

    def still_in(self, cut: Cut) -> bool:
        """Whether ``cut`` may still be selected (False from its drop on)."""
        self._decide()
        return cut not in self.dropped

    def _decide(self) -> None:
        values = self.distances.sequence_values
        running = [cut for cut in self.distances.cuts if cut not in self.dropped]
        batches = min(len(values[cut]) for cut in running)
        if batches == self._decided_batches or len(running) < 2:
            return
        self._decided_batches = batches
        seen = torch.stack([torch.cat(values[cut][:batches]) for cut in running])  # (cuts, sequences)
        k = seen.shape[1]
        if k < self.min_sequences:
            return
        leader = int(seen.sum(dim=1).argmin())
        gaps = seen - seen[leader]
        mean, std = gaps.mean(dim=1), gaps.std(dim=1)
        for i, cut in enumerate(running):
            if i != leader and float(mean[i]) > self.z * float(std[i]) / math.sqrt(k):
                self.dropped[cut] = k
