"""LinearPatch (Chen et al., NeurIPS 2025): the patch at a cut's interface, ``P = H diag(s) H^T``.

``H`` is the official code's orthonormal Hadamard matrix of the hidden size
(:mod:`replaceme_exp.estimation.hadamard`) and ``s`` the mean over calibration sequences of the
per-channel ratio ``mean_t |L_{end-1} H| / mean_t |L_{start-1} H|`` (:class:`ChannelScales`). The
rotation spreads the few massive channels of outlier tokens over all channels, the scaling matches the
magnitude of each rotated channel to what block ``end`` expects, and the inverse rotation goes back:
one d x d matrix applied to the whole output of block ``start - 1`` (``lt_placement=separate``, the
official forward hook). ``rotate=false`` is the official ``insert_type=diag``: ``P = diag(s)`` on
unrotated channels.

The scales, streamed (:class:`ChannelScaleStatistics`, the accumulator the estimator declares): for a
cut ``(start, end)`` and each calibration sequence, the mean over its tokens of ``|x H|`` (per channel;
``H = I`` without rotation) is taken at ``L_{start-1}`` (what block ``start`` receives) and at
``L_{end-1}`` (what block ``end`` receives); their ratio, ``end / start`` per channel, is summed over
sequences. The scales are the mean ratio over sequences: LinearPatch's ``get_scale_params``, whose
batches are single sequences (a ratio per sample, then their average), reproduced for any batching.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from replaceme_exp.capture import distributed
from replaceme_exp.capture.accumulator import Accumulator
from replaceme_exp.capture.statistics import BatchTokens, Cut, Request, cut_keys
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import Estimator, Requirements
from replaceme_exp.estimation.hadamard import hadamard_matrix, hadamard_order, supported_sizes_text


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


def channel_cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One sequence's ``1 - mean_c cos(a[:, c], b[:, c])``: the cosine of each channel's values over
    the sequence's tokens, averaged over channels; (n, d), (n, d) -> () float32. LinearPatch's
    selection (``torch.cosine_similarity`` of (1, seq, hidden) block inputs at its default
    ``dim=1``, the token axis, averaged)."""
    return 1.0 - F.cosine_similarity(a.float(), b.float(), dim=0).mean()


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


class ChannelScaleStatistics(Accumulator):
    """Accumulates :class:`ChannelScales` for every requested cut (``rotate``: through the Hadamard
    matrix of ``hidden_size``, which must be one the official code has). Cached per cut (one cut per
    accumulator), as ``channel_scales`` entries."""

    kind = "channel_scales"
    version = 1

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

    def identity(self) -> dict:
        (cut,) = self.cuts
        return {"cut": list(cut), "rotate": self.rotate}

    def state(self) -> dict[str, torch.Tensor]:
        (cut,) = self.cuts
        return {
            "ratio_sum": self.ratio_sum[cut],
            "n_sequences": torch.tensor(self.n_sequences[cut]),
            "n_tokens": torch.tensor(self.n_tokens[cut]),
        }

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        (cut,) = self.cuts
        self.ratio_sum[cut] = state["ratio_sum"].to(self.ratio_sum[cut].device)
        self.n_sequences[cut], self.n_tokens[cut] = int(state["n_sequences"]), int(state["n_tokens"])

    def merge(self) -> None:
        for cut in sorted(self.cuts):
            distributed.all_reduce_sum(self.ratio_sum[cut])
        for counts in (self.n_sequences, self.n_tokens):
            keys = sorted(counts)
            for key, total in zip(keys, distributed.sum_numbers([counts[k] for k in keys])):
                counts[key] = total

    def result(self) -> dict[Cut, ChannelScales]:
        return {
            cut: ChannelScales(cut, self.ratio_sum[cut], self.n_sequences[cut], self.n_tokens[cut], self.rotate)
            for cut in self.cuts
        }


def patch_matrix(scales: torch.Tensor, rotate: bool = True) -> torch.Tensor:
    """``H diag(s) H^T`` (``rotate``) or ``diag(s)``, (d, d) float64, from ``scales`` (d,)."""
    scales = scales.to(torch.float64)
    if not rotate:
        return torch.diag(scales)
    rotation = hadamard_matrix(scales.shape[0]).to(scales.device)
    return (rotation * scales) @ rotation.T


def check_hidden_size(hidden_size: int, key: str = "objective.rotate") -> None:
    """Refuse a hidden size the official code has no Hadamard matrix for, naming ``key``."""
    if hadamard_order(int(hidden_size)) is None:
        reason = (
            f"needs a Hadamard matrix of the hidden size {hidden_size}; LinearPatch's code has sizes "
            f"{supported_sizes_text()} (objective.rotate=false: the unrotated diagonal patch)"
        )
        raise ConfigError(key, True, reason)


class LinearPatchEstimator(Estimator):
    """The LinearPatch patch of each cut from its :class:`ChannelScales` (:class:`ChannelScaleStatistics`,
    declared by :meth:`accumulators`); nothing regularises it."""

    name = "linear_patch"

    def __init__(self, name: str = "linear_patch", rotate: bool = True):
        self.name, self.rotate = name, bool(rotate)
        self.found: dict[str, dict] = {}

    @classmethod
    def requirements(cls, objective) -> Requirements:
        return Requirements(
            statistics=False,
            uses_alpha=False,
            alpha_scale=None,
            regularizers=("none",),
            structures=("generic",),
            placements=("separate",),
        )

    def accumulators(self, cut: Cut, hidden_size: int, device: torch.device) -> list[Accumulator]:
        return [ChannelScaleStatistics([cut], hidden_size, device, self.rotate)]

    def estimate_from(self, cut: Cut, accumulators: list[Accumulator]) -> torch.Tensor:
        """The patch of ``cut`` from its channel scales; its row columns ``patch_sequences`` (the
        sequences averaged) and ``patch_scale_gap`` (mean ``|s - 1|``, the official "gap")."""
        (statistic,) = accumulators
        scales = statistic.result()[cut]
        self.found.setdefault("patch_sequences", {})[cut] = scales.n_sequences
        self.found.setdefault("patch_scale_gap", {})[cut] = float((scales.scales - 1).abs().mean())
        return self.estimate(scales, 0.0)

    def columns(self) -> dict[str, dict]:
        return self.found

    def estimate(self, stats: ChannelScales | None, alpha: float, structure: str = "generic") -> torch.Tensor:
        if stats is None or stats.n_sequences == 0:
            raise ValueError("LinearPatch needs the channel scales of its cut")
        if self.rotate:
            check_hidden_size(stats.scales.shape[0])
        return patch_matrix(stats.scales, self.rotate)
