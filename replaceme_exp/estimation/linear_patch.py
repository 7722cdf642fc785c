"""LinearPatch (Chen et al., NeurIPS 2025): the patch at a cut's interface, ``P = H diag(s) H^T``.

``H`` is the official code's orthonormal Hadamard matrix of the hidden size
(:mod:`replaceme_exp.capture.hadamard`) and ``s`` the mean over calibration sequences of the
per-channel ratio ``mean_t |L_{end-1} H| / mean_t |L_{start-1} H|``
(:class:`~replaceme_exp.capture.channel_scales.ChannelScales`). The rotation spreads the few
massive channels of outlier tokens over all channels, the scaling matches the magnitude of each
rotated channel to what block ``end`` expects, and the inverse rotation goes back: one d x d matrix
applied to the whole output of block ``start - 1`` (``lt_placement=separate``, the official forward
hook). ``rotate=false`` is the official ``insert_type=diag``: ``P = diag(s)`` on unrotated channels.
"""

from __future__ import annotations

import torch

from replaceme_exp.capture.channel_scales import ChannelScales
from replaceme_exp.capture.hadamard import hadamard_matrix, hadamard_order, supported_sizes_text
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import Estimator, Requirements


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
    """The LinearPatch patch of each cut from its :class:`ChannelScales`; nothing regularises it."""

    name = "linear_patch"
    needs_statistics = False
    needs_channel_scales = True
    uses_alpha = False
    alpha_scale = None

    def __init__(self, name: str = "linear_patch", rotate: bool = True):
        self.name, self.rotate = name, bool(rotate)

    @classmethod
    def requirements(cls, objective) -> Requirements:
        return Requirements(
            statistics=False,
            channel_scales=True,
            uses_alpha=False,
            alpha_scale=None,
            regularizers=("none",),
            structures=("generic",),
            placements=("separate",),
        )

    def estimate(self, stats: ChannelScales | None, alpha: float, structure: str = "generic") -> torch.Tensor:
        if stats is None or stats.n_sequences == 0:
            raise ValueError("LinearPatch needs the channel scales of its cut")
        if self.rotate:
            check_hidden_size(stats.scales.shape[0])
        return patch_matrix(stats.scales, self.rotate)
