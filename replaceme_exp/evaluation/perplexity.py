"""Perplexity of a causal LM on full windows of held-out text, window by window, with its interval."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.intervals import LEVEL, RESAMPLES, perplexity_interval
from replaceme_exp.progress import progress

INTERVAL = f"{LEVEL:.0%} percentile bootstrap over windows ({RESAMPLES} resamples)"
DOCUMENT_INTERVAL = f"{LEVEL:.0%} percentile bootstrap over documents, each with its windows ({RESAMPLES} resamples)"


@dataclass(frozen=True)
class WindowPerplexity:
    """A model's next-token losses on held-out windows: ``nll`` (windows,) each window's summed NLL in
    nats, ``tokens`` (windows,) its predicted tokens, ``windows_hash`` the windows' content (rows with
    the same hash were scored on the same tokens and may be compared window by window), ``documents``
    (windows,) each window's document (None: windows of one text, each resampled alone)."""

    nll: np.ndarray
    tokens: np.ndarray
    windows_hash: str | None = None
    documents: tuple[str, ...] | None = None

    @property
    def value(self) -> float:
        """``exp(sum nll / sum tokens)``."""
        return math.exp(float(self.nll.sum()) / float(self.tokens.sum()))

    def interval(self) -> tuple[float, float]:
        """The value's 95% percentile bootstrap interval over documents (each with all its windows), or
        over windows when they have no documents."""
        return perplexity_interval(self.nll, self.tokens, clusters=self.documents)

    def columns(self, name: str) -> dict:
        """Row columns of this perplexity under ``name`` (``ppl_heldout``, ``ppl_heldout_baseline``):
        the value, its interval (``<name>_ci_low`` / ``<name>_ci_high``) and the per-window NLL
        (``<name>_window_nll``, JSON) that paired comparisons between rows resample."""
        low, high = self.interval()
        return {
            name: self.value,
            f"{name}_ci_low": low,
            f"{name}_ci_high": high,
            f"{name}_window_nll": [float(x) for x in self.nll],
        }

    def unit_columns(self) -> dict:
        """What the intervals rest on, shared by every perplexity of the job on these windows."""
        documents = list(self.documents) if self.documents is not None else None
        return {
            "ppl_heldout_interval": INTERVAL if documents is None else DOCUMENT_INTERVAL,
            "ppl_heldout_windows": int(len(self.tokens)),
            "ppl_heldout_tokens": int(self.tokens.sum()),
            "ppl_heldout_window_tokens": [int(x) for x in self.tokens],
            "ppl_heldout_windows_hash": self.windows_hash,
            "ppl_heldout_documents": len(set(documents)) if documents is not None else None,
            "ppl_heldout_window_documents": documents,
            "ppl_heldout_domains": domain_counts(documents) if documents is not None else None,
        }

    def to_json(self) -> dict:
        return {"nll": [float(x) for x in self.nll], "tokens": [int(x) for x in self.tokens]}

    @classmethod
    def from_json(
        cls, data: dict, windows_hash: str | None = None, documents: list[str] | None = None
    ) -> "WindowPerplexity":
        found = tuple(documents) if documents is not None else None
        return cls(np.asarray(data["nll"], dtype=np.float64), np.asarray(data["tokens"]), windows_hash, found)


def domain_counts(documents: list[str]) -> dict[str, int]:
    """How many distinct documents of each domain (a document id's part before ``:``)."""
    counts: dict[str, int] = {}
    for name in dict.fromkeys(documents):
        domain = name.split(":", 1)[0]
        counts[domain] = counts.get(domain, 0) + 1
    return counts


def perplexity(model, windows: TokenBatches) -> float:
    """:func:`window_perplexity`'s value."""
    return window_perplexity(model, windows).value


@torch.inference_mode()
def window_perplexity(model, windows: TokenBatches) -> WindowPerplexity:
    """``exp`` of the mean next-token negative log-likelihood over all predicted tokens of the
    windows (each window is scored on its own, no context carried across windows).

    Only positions 1.. of a window are predicted, so the first token, the BOS that
    :func:`~replaceme_exp.data.batching.pack_windows` puts there when the tokenizer has one, is
    context and never a target: with a BOS each window scores its ``seq_len - 1`` text tokens,
    and every text token of the windows is scored exactly once. (A BOS id inside the stream, e.g.
    a tokenizer whose BOS is also its EOS separator, is text and counts.)

    ``ppl_heldout`` is this per-token perplexity over fixed windows of held-out pydoc text
    (``eval.seq_len`` tokens, ``eval.max_windows`` of them, BOS-prefixed). It is not comparable
    in value with lm-eval's perplexities: ``word_perplexity`` (``ppl_pydoc`` of ``eval=offline``)
    is ``exp`` of the total NLL divided by the number of *words*, summed per document over
    rolling windows of the model's full ``max_length`` (more context per token, and a per-word
    rather than per-token normalisation, so it moves with the tokenizer's granularity), and
    lambada's ``perplexity`` (``ppl_lambada``) is ``exp`` of the mean NLL of the *last word* of
    each passage given the whole passage before it.

    Returns each window's summed NLL and predicted tokens (:class:`WindowPerplexity`), in the order
    of the windows.
    """
    device = model.get_input_embeddings().weight.device
    nll: list[float] = []
    count: list[int] = []
    for batch in progress(windows, desc="perplexity", unit="batch"):
        ids = batch.input_ids.to(device)
        mask = batch.attention_mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (batch, seq_len, vocab)
        # With device_map=auto the logits may live on another GPU than the inputs. Position t predicts
        # token t + 1; the last position predicts nothing (-100, as padding).
        targets = torch.full_like(ids, -100)
        targets[:, :-1] = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        targets = targets.to(logits.device)
        # (batch, seq_len) per-token losses, on the logits' own contiguous (batch * seq_len, vocab) rows: the
        # (batch, vocab, seq) form and a copy of the shifted logits are several times slower on a CPU
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.view(-1), reduction="none", ignore_index=-100
        ).view(targets.shape)
        nll += loss.double().sum(dim=1).tolist()
        count += (targets != -100).sum(dim=1).tolist()
    documents = tuple(windows.documents) if windows.documents is not None else None
    return WindowPerplexity(np.asarray(nll), np.asarray(count), windows.content_hash(), documents)
