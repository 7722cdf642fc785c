"""Calibration batches and held-out windows from a ``calibration`` / ``eval`` config group."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from replaceme_exp.data.batching import TokenBatches, pack_windows, tokenize_documents
from replaceme_exp.data.generated import self_generated_documents
from replaceme_exp.data.sources import document_as_chat, hf_dataset_documents, pydoc_documents, text_file_documents
from replaceme_exp.errors import ConfigError

# Documents are packed to about this many characters per calibration token, so that most of them
# fill seq_len and some (paragraph tails) are shorter: real padding in every batch.
CHARS_PER_TOKEN = 4


def _positive(cfg: DictConfig, key: str, prefix: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{prefix}.{key}", value, "must be a positive integer")
    return value


@dataclass
class Answerer:
    """The model that answers the prompts of ``source: generated`` (with its identity hash, which
    keys the cached answers under ``cache_dir/generated``)."""

    model: Any
    identity: str
    cache_dir: str


def calibration_documents(
    cfg: DictConfig, tokenizer, n_samples: int, seed: int, answerer: Answerer | None = None
) -> list[str]:
    """``n_samples`` documents drawn reproducibly from the configured source; ``pydoc_chat`` returns
    the documents that ``pydoc`` draws with the same seed, each rendered as a chat; ``generated``
    the shipped (or given) prompts answered by ``answerer``'s model, as chats."""
    source = cfg.source
    if source == "generated":
        if answerer is None:
            raise ConfigError("calibration.source", source, "needs the model to answer its prompts")
        return self_generated_documents(cfg, tokenizer, answerer.model, answerer.identity, answerer.cache_dir)
    max_chars = cfg.seq_len * CHARS_PER_TOKEN
    if source in ("pydoc", "pydoc_chat", "text_file"):
        documents = (
            text_file_documents(cfg.get("path"), max_chars)
            if source == "text_file"
            else pydoc_documents("calibration", max_chars)
        )
        if len(documents) < n_samples:
            raise ConfigError(
                "calibration.n_samples",
                n_samples,
                f"the {source} source holds only {len(documents)} documents of up to {cfg.seq_len} tokens; "
                f"lower n_samples or give more text",
            )
        order = list(range(len(documents)))
        random.Random(seed).shuffle(order)
        chosen = [documents[i] for i in order[:n_samples]]
        return [document_as_chat(d, tokenizer) for d in chosen] if source == "pydoc_chat" else chosen
    if source == "hf_dataset":
        data_files = cfg.get("path") if cfg.get("dataset") == "json" else cfg.get("data_files")
        if cfg.get("dataset") == "json" and not data_files:
            raise ConfigError("calibration.path", data_files, "set the path of a JSONL file")
        documents = hf_dataset_documents(
            path=cfg.dataset,
            name=cfg.get("subset"),
            split=cfg.get("split", "train"),
            data_files=data_files,
            text_field=cfg.get("text_field"),
            chat_field=cfg.get("chat_field"),
            text_template=cfg.get("text_template"),
            order=cfg.get("order", "shuffled"),
            chat_turns=cfg.get("chat_turns", "all"),
            pair_fields=OmegaConf.to_container(cfg.pair_fields) if cfg.get("pair_fields") else None,
            n_records=n_samples,
            seed=seed,
            streaming=bool(cfg.get("streaming", False)),
            tokenizer=tokenizer,
        )
        return documents
    if source == "mix":
        documents = []
        parts = cfg.parts
        for i, part in enumerate(parts.values()):
            share = round(n_samples * float(part.fraction)) if i < len(parts) - 1 else n_samples - len(documents)
            documents.extend(calibration_documents(part, tokenizer, share, seed + i, answerer))
        random.Random(seed).shuffle(documents)
        return documents
    raise ConfigError("calibration.source", source, "choose pydoc, pydoc_chat, text_file, hf_dataset, generated or mix")


def build_calibration(cfg: DictConfig, tokenizer, answerer: Answerer | None = None) -> TokenBatches:
    """Padded calibration batches: ``n_samples`` sequences of at most ``seq_len`` tokens
    (``answerer``: the model that answers the prompts of ``source: generated``)."""
    n_samples = _positive(cfg, "n_samples", "calibration")
    _positive(cfg, "seq_len", "calibration")
    batch_size = _positive(cfg, "batch_size", "calibration")
    documents = calibration_documents(cfg, tokenizer, n_samples, int(cfg.seed), answerer)
    batches = tokenize_documents(
        documents,
        tokenizer,
        seq_len=cfg.seq_len,
        batch_size=batch_size,
        padding_side=cfg.get("padding_side", "right"),
    )
    if batches.n_tokens == 0:
        raise ConfigError("calibration", cfg.get("name"), "the calibration text tokenises to no tokens")
    return batches


def heldout_windows(cfg: DictConfig, tokenizer) -> TokenBatches:
    """Full windows of held-out text for perplexity and held-out distances (``eval`` group)."""
    seq_len = _positive(cfg, "seq_len", "eval")
    max_chars = seq_len * CHARS_PER_TOKEN
    if cfg.text == "pydoc_heldout":
        documents = pydoc_documents("heldout", max_chars)
    elif cfg.text == "text_file":
        documents = text_file_documents(cfg.get("path"), max_chars, key="eval.path")
    else:
        raise ConfigError("eval.text", cfg.text, "choose pydoc_heldout or text_file")
    windows = pack_windows(documents, tokenizer, seq_len, _positive(cfg, "max_windows", "eval"), cfg.batch_size)
    if len(windows) == 0:
        raise ConfigError("eval.seq_len", seq_len, "the held-out text is shorter than one window")
    return windows


HEALING_SOURCES = ("pydoc", "text_file", "hf_dataset")


def healing_documents(cfg: DictConfig, tokenizer, context_length: int, seed: int) -> list[str]:
    """The documents that healing trains on (``healing.data``), in an order drawn by ``seed``:
    ``pydoc`` (the calibration part of ``pydoc_data.topics``, disjoint from the held-out part that
    perplexity is measured on), ``text_file`` (a user's text, ``healing.data.path``) or
    ``hf_dataset`` (the paper: C4 from the hub; ``n_documents`` records)."""
    source = cfg.get("source")
    max_chars = context_length * CHARS_PER_TOKEN
    if source in ("pydoc", "text_file"):
        documents = (
            text_file_documents(cfg.get("path"), max_chars, key="healing.data.path")
            if source == "text_file"
            else pydoc_documents("calibration", max_chars)
        )
        random.Random(seed).shuffle(documents)
        return documents
    if source == "hf_dataset":
        return hf_dataset_documents(
            path=cfg.dataset,
            name=cfg.get("subset"),
            split=cfg.get("split", "train"),
            data_files=cfg.get("data_files"),
            text_field=cfg.get("text_field", "text"),
            chat_field=cfg.get("chat_field"),
            n_records=_positive(cfg, "n_documents", "healing.data"),
            seed=seed,
            streaming=bool(cfg.get("streaming", True)),
            tokenizer=tokenizer,
        )
    raise ConfigError("healing.data.source", source, f"choose one of {HEALING_SOURCES}")
