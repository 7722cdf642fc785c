"""Which calibration tokens enter a transform's statistics (``estimation.tokens``).

The paper and the official code fit every non-padding token. In Llama-family models the first
token of a sequence (the attention sink) carries massive activations: on SmolLM2 its residual
norm is 30-200x the median from block 11 on, and it holds about 99.5% of the least-squares target
``||L_{end-1} - Y_{start-1}||^2`` of cut [11, 19). A transform fitted on all tokens is spent on
reproducing that one token. The rules:

- ``all``: every non-padding token (the paper); with ``padded_positions`` also every padded
  position, whose activations the official code's ``view(-1, hidden)`` of padded batches keeps;
- ``skip_first``: leave out the first ``first`` positions of each sequence (position ids, so a
  masked copy's hidden tokens do not shift them);
- ``skip_massive``: leave out the tokens whose residual norm, at the cut's input ``L_{start-1}``
  or at its target ``L_{end-1}``, exceeds ``massive_threshold`` times the median norm of that
  activation over the token's own sequence (so batching and padding never change the choice);
- ``rescale_massive``: keep those tokens but scale their rows (input and target alike) by
  ``massive_threshold`` x median / norm: their norm is clipped to the threshold, so a sink weighs
  in the least squares like ``threshold^2`` ordinary tokens instead of dominating it, and T still
  learns to map it (the skip rules leave it unmapped, which breaks the sink when the cut removes
  the block that creates its massive activation).

The fused T still acts on every token at inference. The held-out check reports distances on the
sink tokens (:func:`massive_tokens` with the same threshold, whatever the rule) and on the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replaceme_exp.errors import ConfigError

TOKEN_RULES = ("all", "skip_first", "skip_massive", "rescale_massive")


def norm_ratios(activations: tuple[torch.Tensor, ...], last_rows: torch.Tensor) -> torch.Tensor:
    """Per token, the largest ratio of its norm to the median norm of its own sequence, across
    ``activations`` (each (n_tokens, hidden), sequences concatenated; ``last_rows`` (batch,) the
    row of each sequence's last token). Per sequence, so batching never changes it. Returns a
    float32 (n_tokens,) tensor."""
    ends = last_rows.tolist()
    starts = [0] + [end + 1 for end in ends[:-1]]
    ratios = None
    for acts in activations:
        norms = acts.float().norm(dim=-1)
        medians = torch.empty_like(norms)
        for start, end in zip(starts, ends):
            medians[start : end + 1] = norms[start : end + 1].median()
        ratio = norms / medians.clamp_min(torch.finfo(torch.float32).tiny)
        ratios = ratio if ratios is None else torch.maximum(ratios, ratio)
    return ratios


def massive_tokens(activations: tuple[torch.Tensor, ...], last_rows: torch.Tensor, threshold: float):
    """Tokens whose norm in any of ``activations`` exceeds ``threshold`` times that activation's
    median norm over the token's sequence (see :func:`norm_ratios`). Returns a bool (n_tokens,)
    mask."""
    return norm_ratios(activations, last_rows) > threshold


@dataclass(frozen=True)
class TokenRule:
    """``kind`` in :data:`TOKEN_RULES`; ``first``: positions left out by ``skip_first``;
    ``massive_threshold``: norm over median above which a token is massive (``skip_massive``, and
    the sink/rest split of the held-out distances)."""

    kind: str = "all"
    first: int = 1
    massive_threshold: float = 20.0
    padded_positions: bool = False

    def __post_init__(self):
        if self.kind not in TOKEN_RULES:
            raise ConfigError("estimation.tokens", self.kind, f"choose one of {TOKEN_RULES}")
        if isinstance(self.first, bool) or not isinstance(self.first, int) or self.first < 1:
            raise ConfigError("estimation.first", self.first, "must be a positive integer (positions left out)")
        threshold = self.massive_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ConfigError("estimation.massive_threshold", threshold, "must be a finite number > 1")
        if threshold <= 1:
            raise ConfigError("estimation.massive_threshold", threshold, "must be > 1 (times the median norm)")
        if self.padded_positions and self.kind != "all":
            raise ConfigError(
                "estimation.padded_positions",
                True,
                f"adds every padded position to the fit (the official code), which only estimation.tokens=all "
                f"does; tokens={self.kind} picks tokens by their sequence",
            )

    @property
    def per_cut(self) -> bool:
        """Whether the kept tokens depend on the cut's end (so cuts sharing a start cannot share
        one ``M^T M``)."""
        return self.kind in ("skip_massive", "rescale_massive")

    def key(self) -> str:
        """What the rule selects, for cache keys: ``all``, ``all+padded``, ``skip_first=2``,
        ``skip_massive=20``."""
        if self.padded_positions:
            return "all+padded"
        if self.kind == "skip_first":
            return f"skip_first={self.first}"
        if self.kind in ("skip_massive", "rescale_massive"):
            return f"{self.kind}={float(self.massive_threshold)!r}/sequence-median"
        return "all"

    def keep(self, tokens, before: torch.Tensor, after: torch.Tensor | None = None):
        """How the tokens enter the statistics: None (all, as they are), a bool (n_tokens,) mask
        of the tokens kept, or a float32 (n_tokens,) scale of each token's rows. ``tokens``: the
        batch's :class:`~replaceme_exp.capture.statistics.BatchTokens` (``positions`` (n_tokens,)
        in their sequences, ``last_rows`` the sequence ends); ``before`` = L_{start-1} and
        ``after`` = L_{end-1} are (n_tokens, hidden)."""
        if self.kind == "skip_first":
            return tokens.positions.to(before.device) >= self.first
        if self.kind in ("skip_massive", "rescale_massive"):
            ratios = norm_ratios((before,) if after is None else (before, after), tokens.last_rows)
            if self.kind == "skip_massive":
                return ratios <= self.massive_threshold
            clipped = self.massive_threshold / ratios
            return torch.where(ratios > self.massive_threshold, clipped, torch.ones_like(ratios))
        return None


def kept(tensor: torch.Tensor, selection: torch.Tensor | None) -> torch.Tensor:
    """``tensor`` (n_tokens, ...) as :meth:`TokenRule.keep`'s ``selection`` has it enter: all rows
    (None), the rows a bool mask keeps, or every row times its float scale."""
    if selection is None:
        return tensor
    selection = selection.to(tensor.device)
    if selection.dtype == torch.bool:
        return tensor[selection]
    return tensor * selection.to(tensor.dtype).unsqueeze(-1)
