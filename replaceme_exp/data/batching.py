"""Tokenised, padded batches and their content hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass
class TokenBatch:
    """``input_ids``, ``attention_mask``: (batch, seq) int64; padding where the mask is 0.
    ``position_ids`` (batch, seq), optional: explicit positions (masked copies keep the positions
    of the unmasked sequence); None = counted over the attention mask."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())


@dataclass
class ImageBatch:
    """``pixel_values`` (batch, 3, height, width) as the model's image processor makes them;
    ``attention_mask`` (batch, positions) all ones: every patch position and the class token is a
    token of the capture (a vision encoder has no padding)."""

    pixel_values: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())


def position_ids_for(mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over non-padding tokens, so left padding does not shift RoPE."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class TokenBatches:
    """Batches of sequences of at most ``seq_len`` tokens. ``documents``, optional: the document each
    sequence comes from, in sequence order (held-out windows: what a perplexity interval resamples)."""

    batches: list[TokenBatch]
    seq_len: int
    documents: list[str] | None = None

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def n_sequences(self) -> int:
        return sum(b.input_ids.shape[0] for b in self.batches)

    @property
    def n_tokens(self) -> int:
        """Non-padding tokens."""
        return sum(b.n_tokens for b in self.batches)

    @property
    def n_positions(self) -> int:
        """Every position of every batch, padded ones included."""
        return sum(b.attention_mask.numel() for b in self.batches)

    def layout_hash(self) -> str:
        """The content hash, plus how the sequences are batched and padded (what statistics that
        include padded positions depend on)."""
        h = hashlib.sha256(self.content_hash().encode())
        for batch in self.batches:
            h.update(f"{tuple(batch.attention_mask.shape)}|".encode())
            h.update(batch.attention_mask.numpy().astype("int8").tobytes())
        return h.hexdigest()[:16]

    def content_hash(self) -> str:
        """Hash of the token ids (or, for images, the pixels) that the model sees
        (order-independent of batching)."""
        h = hashlib.sha256()
        for batch in self.batches:
            if isinstance(batch, ImageBatch):  # the pixels the model sees
                for image in batch.pixel_values:
                    h.update(f"{tuple(image.shape)}|{image.dtype}|".encode())
                    h.update(image.contiguous().view(torch.uint8).numpy().tobytes() + b"|")
                continue
            for row, (ids, mask) in enumerate(zip(batch.input_ids, batch.attention_mask)):
                h.update(ids[mask.bool()].numpy().astype("int64").tobytes())
                if batch.position_ids is not None:  # which tokens a masked copy hides
                    h.update(b"@" + batch.position_ids[row][mask.bool()].numpy().astype("int64").tobytes())
                h.update(b"|")
        if self.documents is not None:  # which windows belong together
            h.update(("documents:" + "\n".join(self.documents)).encode())
        return h.hexdigest()[:16]


def with_counted_positions(batches: TokenBatches) -> TokenBatches:
    """``batches`` with explicit positions ``0..width-1`` on every row, padded ones too: what a
    model given no position ids uses (the official code), so right-padded positions continue
    counting instead of repeating the last token's position. Tokens' positions are unchanged under
    right padding."""
    out = []
    for batch in batches:
        rows, width = batch.input_ids.shape
        positions = torch.arange(width, dtype=torch.long).expand(rows, width).clone()
        out.append(TokenBatch(batch.input_ids, batch.attention_mask, positions))
    return TokenBatches(out, batches.seq_len)


def pad_sequences(sequences: list[list[int]], pad_id: int, side: str) -> TokenBatch:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if side == "left":
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
        else:
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
    return TokenBatch(ids, mask)


def tokenize_documents(
    documents: list[str],
    tokenizer,
    seq_len: int,
    batch_size: int,
    padding_side: str = "right",
    sort_by_length: bool = True,
) -> TokenBatches:
    """Tokenise each document (truncated to ``seq_len`` tokens) into padded batches.

    With ``sort_by_length`` the sequences are batched longest first, which wastes the least
    compute on padding; statistics are sums over tokens, so the order does not change them.
    """
    encoded = tokenizer(documents, add_special_tokens=True, truncation=True, max_length=seq_len)["input_ids"]
    sequences = [ids for ids in encoded if len(ids) > 0]
    if sort_by_length:
        sequences.sort(key=len, reverse=True)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = [
        pad_sequences(sequences[i : i + batch_size], pad_id, padding_side) for i in range(0, len(sequences), batch_size)
    ]
    return TokenBatches(batches, seq_len)


def pack_windows(documents: list[str], tokenizer, seq_len: int, max_windows: int, batch_size: int) -> TokenBatches:
    """Concatenate the documents (separated by EOS) and cut the token stream into at most
    ``max_windows`` full windows of ``seq_len`` tokens (no padding): the perplexity protocol.

    When the tokenizer defines a BOS token (``bos_token_id is not None``) each window is that
    BOS followed by the next ``seq_len - 1`` tokens of the stream, so that every text token is
    predicted from at least one token of context, as in lm-eval's rolling loglikelihood (which
    conditions the first token on a prefix token); the BOS itself is never predicted (it is the
    first position). Without a BOS the windows are ``seq_len`` consecutive stream tokens, the
    first of each only serving as context. Either way the windows do not overlap on the stream.
    """
    stream: list[int] = []
    eos = tokenizer.eos_token_id
    bos = getattr(tokenizer, "bos_token_id", None)
    prefix = [] if bos is None else [bos]
    step = seq_len - len(prefix)  # stream tokens per window
    if step < 1:
        raise ValueError(f"seq_len={seq_len} leaves no room for text after the BOS token")
    for doc in documents:
        stream.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        if eos is not None:
            stream.append(eos)
        if len(stream) >= step * max_windows:
            break
    n_windows = min(max_windows, len(stream) // step)
    windows = [prefix + stream[i * step : (i + 1) * step] for i in range(n_windows)]
    batches = [pad_sequences(windows[i : i + batch_size], eos or 0, "right") for i in range(0, n_windows, batch_size)]
    return TokenBatches(batches, seq_len)


def document_windows(
    documents: list[tuple[str, str]],
    tokenizer,
    seq_len: int,
    max_windows: int,
    windows_per_document: int,
    batch_size: int,
) -> TokenBatches:
    """Windows cut from each document on its own: ``documents`` as ``(id, text)`` in the order taken;
    each document's tokens (then EOS) give up to ``windows_per_document`` consecutive windows of
    ``seq_len`` tokens (BOS first when the tokenizer has one, as :func:`pack_windows`), until
    ``max_windows`` windows are taken. A document's first window is kept even when the document is
    shorter (right-padded, masked); a later window only when full. No window spans two documents, so
    the windows of each document can be resampled together (``TokenBatches.documents``)."""
    eos = tokenizer.eos_token_id
    bos = getattr(tokenizer, "bos_token_id", None)
    prefix = [] if bos is None else [bos]
    step = seq_len - len(prefix)
    if step < 1:
        raise ValueError(f"seq_len={seq_len} leaves no room for text after the BOS token")
    windows: list[list[int]] = []
    owners: list[str] = []
    for name, text in documents:
        if len(windows) >= max_windows:
            break
        stream = tokenizer(text, add_special_tokens=False)["input_ids"] + ([] if eos is None else [eos])
        for k in range(windows_per_document):
            piece = stream[k * step : (k + 1) * step]
            if len(windows) >= max_windows or not piece or (k and len(piece) < step):
                break
            windows.append(prefix + piece)
            owners.append(name)
    batches = [
        pad_sequences(windows[i : i + batch_size], eos or 0, "right") for i in range(0, len(windows), batch_size)
    ]
    return TokenBatches(batches, seq_len, owners)
