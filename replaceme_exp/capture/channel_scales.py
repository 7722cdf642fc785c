"""Per-channel magnitude ratios across a cut, streamed: the statistic of LinearPatch's scaling.

For a cut ``(start, end)`` and each calibration sequence, the mean over its tokens of ``|x H|``
(per channel; ``H`` the official code's Hadamard matrix, :mod:`replaceme_exp.capture.hadamard`, or
the identity without rotation) is taken at ``L_{start-1}`` (what block ``start`` receives) and at
``L_{end-1}`` (what block ``end`` receives); their ratio, ``end / start`` per channel, is summed over
sequences. The scales are the mean ratio over sequences: LinearPatch's ``get_scale_params``, whose
batches are single sequences (a ratio per sample, then their average), reproduced for any batching.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaceme_exp.capture.hadamard import hadamard_matrix
from replaceme_exp.capture.statistics import BatchTokens, Cut, Request, cut_keys


@dataclass
class ChannelScales:
    """One cut's accumulated ratios: ``ratio_sum`` (hidden,) float64, the sum over ``n_sequences``
    sequences of ``mean_t |L_{end-1} H| / mean_t |L_{start-1} H|``; ``n_tokens`` the tokens they
    hold; ``rotate``: whether ``H`` rotated them (else ``H = I``)."""

    cut: Cut
    ratio_sum: torch.Tensor
    n_sequences: int
    n_tokens: int
    rotate: bool

    @property
    def scales(self) -> torch.Tensor:
        """The mean ratio per (rotated) channel, (hidden,) float64."""
        return self.ratio_sum / max(self.n_sequences, 1)


def sequence_ids(tokens: BatchTokens, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For flattened non-padding rows (sequences one after another): each row's sequence, (n_rows,),
    and each sequence's token count, (batch,)."""
    ends = tokens.last_rows.long() + 1
    lengths = torch.diff(ends, prepend=ends.new_zeros(1))
    ids = torch.repeat_interleave(torch.arange(len(lengths), device=ends.device), lengths, output_size=n_rows)
    return ids, lengths


def sequence_means(x: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean of the rows of ``x`` (n_rows, d) -> (batch, d) float64."""
    sums = torch.zeros(len(lengths), x.shape[1], dtype=torch.float64, device=x.device)
    sums.index_add_(0, ids.to(x.device), x.double())
    return sums / lengths.to(x.device).clamp(min=1).unsqueeze(1).double()


class ChannelScaleStatistics:
    """Accumulates :class:`ChannelScales` for every requested cut (``rotate``: through the Hadamard
    matrix of ``hidden_size``, which must be one the official code has)."""

    takes_padding = False  # padded positions are not data

    def __init__(self, cuts: list[Cut], hidden_size: int, device: torch.device, rotate: bool = True):
        self.cuts, self.rotate = list(cuts), bool(rotate)
        self.rotation = hadamard_matrix(hidden_size).to(device) if self.rotate else None
        zeros = lambda: torch.zeros(hidden_size, dtype=torch.float64, device=device)  # noqa: E731
        self.ratio_sum = {cut: zeros() for cut in self.cuts}
        self.n_sequences = {cut: 0 for cut in self.cuts}
        self.n_tokens = {cut: 0 for cut in self.cuts}

    def requests(self) -> list[Request]:
        return [(cut_keys(cut, with_mlp=False), self._updater(cut)) for cut in self.cuts]

    def _magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        if self.rotation is not None:
            x = x @ self.rotation.to(x.device)
        return x.abs()

    def _updater(self, cut: Cut):
        before, after = cut_keys(cut, with_mlp=False)

        def update(acts: dict, tokens: BatchTokens) -> None:
            start, end = acts[before], acts[after]
            ids, lengths = sequence_ids(tokens, start.shape[0])
            present = lengths > 0  # a sequence of padding only has no mean
            ratio = sequence_means(self._magnitudes(end), ids, lengths) / sequence_means(
                self._magnitudes(start), ids, lengths
            )
            self.ratio_sum[cut] += ratio[present.to(ratio.device)].sum(0).to(self.ratio_sum[cut].device)
            self.n_sequences[cut] += int(present.sum())
            self.n_tokens[cut] += int(start.shape[0])

        return update

    def result(self) -> dict[Cut, ChannelScales]:
        return {
            cut: ChannelScales(cut, self.ratio_sum[cut], self.n_sequences[cut], self.n_tokens[cut], self.rotate)
            for cut in self.cuts
        }
