"""lm-eval's loglikelihood requests with the LM head applied only where lm-eval scores.

lm-eval's HFLM projects every position of every padded row onto the vocabulary, then keeps the
continuation's positions (``_select_cont_toks``). On a multiple-choice item the continuation is a
few tokens of a prompt of a hundred, and the projection is the largest matrix product of a small
model with a large vocabulary (Gemma 3 270M: 640 x 262,144 per position, more than its 18 blocks).

:class:`ScoredPositionsMixin`, placed before HFLM in a subclass's bases, asks the model for the
logits of each row's last ``K`` input positions only (transformers' ``logits_to_keep``, a
(batch, K) tensor of positions; K the batch's longest continuation) and hands lm-eval the tail of
those. lm-eval's own loop, softmax, greedy check and caching run unchanged on them, so every
request gets the log-probabilities of the same hidden states through the same head; a batch it
cannot place exactly (a row matching no request, or two) is scored over all positions as before.
"""

from __future__ import annotations

import inspect

import torch


def request_input(context: list[int], continuation: list[int], max_length: int) -> tuple[int, ...]:
    """The model input lm-eval builds for a causal request: context + continuation, cut to the last
    ``max_length + 1`` tokens, without the last one (lm-eval's ``_loglikelihood_tokens``)."""
    return tuple((context + continuation)[-(max_length + 1) :][:-1])


def row_lengths(row: list[int], scored: dict[tuple[int, ...], int], pad: int = 0) -> tuple[int, int] | None:
    """(input length, positions to score) of one right-padded row (lm-eval pads with ``pad``) from
    the requests' inputs; None when no request, or more than one, fits the row."""
    unpadded = len(row)
    while unpadded > 0 and row[unpadded - 1] == pad:
        unpadded -= 1
    fits = [n for n in range(len(row), max(unpadded, 1) - 1, -1) if tuple(row[:n]) in scored]
    if len(fits) != 1:
        return None
    return fits[0], scored[tuple(row[: fits[0]])]


def kept_positions(lengths: list[tuple[int, int]]) -> torch.Tensor:
    """(batch, K) positions: row i's last K input positions (K = the longest continuation), the
    first ones clamped at 0 for a row shorter than K (its continuation is within its last
    ``contlen <= input length`` positions, which stay exact)."""
    k = max(n for _, n in lengths)
    ends = torch.tensor([length for length, _ in lengths])
    return (ends[:, None] - k + torch.arange(k)[None, :]).clamp(min=0)


class ScoredPositionsMixin:
    """See the module docstring. Only for the causal backend and models whose forward takes
    ``logits_to_keep``; otherwise HFLM's own path."""

    _scored: dict[tuple[int, ...], int] | None = None
    _tail_only = False

    def _keeps_logits(self) -> bool:
        if getattr(self, "_accepts_logits_to_keep", None) is None:
            forward = getattr(self.model, "forward", None)
            params = inspect.signature(forward).parameters if forward is not None else {}
            self._accepts_logits_to_keep = "logits_to_keep" in params
        return self.backend == "causal" and self._accepts_logits_to_keep

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        if not self._keeps_logits():
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, **kwargs)
        scored: dict[tuple[int, ...], int] = {}
        for _, context, continuation in requests:
            key = request_input(context, continuation, self.max_length)
            scored[key] = max(scored.get(key, 0), len(continuation))
        outer, self._scored = self._scored, scored
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, **kwargs)
        finally:
            self._scored, self._tail_only = outer, False

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None) -> torch.Tensor:
        self._tail_only = False
        if self._scored is None or attn_mask is not None or labels is not None:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        lengths = [row_lengths(row, self._scored) for row in inps.tolist()]
        if any(found is None for found in lengths):
            return super()._model_call(inps)
        positions = kept_positions(lengths).to(inps.device)
        with (
            torch.no_grad(),
            torch.autocast(
                device_type=self.device.type,
                dtype=self.mixed_precision_dtype,
                enabled=self.mixed_precision_dtype is not None,
            ),
        ):
            logits = self.model(inps, logits_to_keep=positions).logits  # (batch, K, vocab)
        self._tail_only = True
        return logits

    def _select_cont_toks(self, logits: torch.Tensor, contlen: int | None = None, inplen: int | None = None):
        if self._tail_only:
            return logits[logits.shape[0] - contlen :]  # (contlen, vocab): the row's last positions
        return super()._select_cont_toks(logits, contlen=contlen, inplen=inplen)
