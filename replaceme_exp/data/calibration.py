"""Calibration data: the registry of calibration sources, and the batches a job calibrates on.

A source (``calibration.source``) is registered with the schema shapes of its options and a
reader: a text source yields documents (rendered text: prose, or chats in the model's template),
an image source yields images. A source that reads a user's files or the hub also declares, for
the checks before the model loads, a ``check`` of its files and the ``hub_datasets`` it reads.
Adding a source is one file that registers it (see ``docs/extending/calibration-source.md``) and
one YAML under ``conf/calibration``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

from replaceme_exp.config import schema
from replaceme_exp.config.protocol import protocol_rule
from replaceme_exp.config.validate import build
from replaceme_exp.data import files
from replaceme_exp.data.batching import TokenBatches, document_windows, pack_windows, tokenize_documents
from replaceme_exp.data.files import JsonRecords, check_readable, check_text
from replaceme_exp.data.generated import check_prompts, prompt_files, prompts_hub_datasets, self_generated_documents
from replaceme_exp.data.heldout_documents import heldout_documents
from replaceme_exp.data.hub import HubDataset
from replaceme_exp.data.sources import (
    document_as_chat,
    hf_dataset_documents,
    pack_paragraphs,
    pydoc_documents,
    render_record,
    text_file_documents,
)
from replaceme_exp.errors import ConfigError
from replaceme_exp.registry import Registry

# Documents are packed to about this many characters per calibration token, so that most of them
# fill seq_len and some (paragraph tails) are shorter: real padding in every batch.
CHARS_PER_TOKEN = 4


@dataclass
class Answerer:
    """The model that answers the prompts of ``source: generated`` (with its identity hash, which
    keys the cached answers under ``cache_dir/generated``)."""

    model: Any
    identity: str
    cache_dir: str


def no_files(cfg, key: str, n_samples: int | None) -> None:
    """A source that reads no file of the user's."""


def no_hub_datasets(cfg, key: str) -> list[HubDataset]:
    """A source that reads nothing from the hub."""
    return []


def no_settings(cfg, key: str) -> None:
    """A source whose options need no check beyond their schema."""


@dataclass(frozen=True)
class CalibrationSource:
    """A kind of calibration data. ``modality``: ``text`` or ``vision``; ``shapes``: the schema
    classes its options may take; ``read``: for text ``(cfg, tokenizer, n_samples, seed,
    answerer) -> documents``, for images ``(cfg) -> {name: PIL image}``. Checked before the model
    loads: ``check(cfg, key, n_samples)`` reads the user's files the source reads (``key``: where
    its options are, e.g. ``calibration``; ``n_samples``: what it must give, None: not known) and
    raises one :class:`ConfigError` for the first problem; ``hub_datasets(cfg, key)`` lists the
    hub datasets it reads (:func:`~replaceme_exp.data.hub.require_available` resolves them);
    ``settings(cfg, key)`` checks its options wherever a configuration is resolved (cheap: a file is
    only opened, to know it can be read)."""

    name: str
    modality: str
    shapes: tuple[type, ...]
    read: Callable
    check: Callable[[Any, str, int | None], None] = no_files
    hub_datasets: Callable[[Any, str], list[HubDataset]] = no_hub_datasets
    settings: Callable[[Any, str], None] = no_settings


CALIBRATION_SOURCES: Registry[CalibrationSource] = Registry("calibration.source", "calibration source")
# What to calibrate on instead of a text dataset that cannot be read here.
LOCAL_TEXT = "calibrate on local text (calibration=pydoc, text_file or jsonl)"


def calibration_source(
    name: str,
    modality: str,
    *shapes: type,
    check: Callable = no_files,
    hub_datasets: Callable = no_hub_datasets,
    settings: Callable = no_settings,
) -> Callable:
    """Register the decorated reader as the calibration source ``name`` (with its ``check`` of
    files, its ``hub_datasets`` and its ``settings`` check, see :class:`CalibrationSource`)."""

    def register(read: Callable) -> Callable:
        source = CalibrationSource(name, modality, shapes, read, check, hub_datasets, settings)
        CALIBRATION_SOURCES.register(name, source)
        return read

    return register


def too_few(count: int, n_samples: int, source: str, seq_len: int) -> ConfigError | None:
    """The refusal of ``n_samples`` drawn from ``count`` documents (None: enough)."""
    if count >= n_samples:
        return None
    reason = f"the {source} source holds only {count} documents of up to {seq_len} tokens"
    return ConfigError("calibration.n_samples", n_samples, f"{reason}; lower n_samples or give more text")


def drawn_documents(documents: list[str], n_samples: int, seed: int, source: str, seq_len: int) -> list[str]:
    """``n_samples`` of ``documents`` in an order drawn by ``seed``."""
    if refusal := too_few(len(documents), n_samples, source, seq_len):
        raise refusal
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    return [documents[i] for i in order[:n_samples]]


@calibration_source("pydoc", "text", schema.TextCalibrationConfig)
def pydoc_calibration(cfg, tokenizer, n_samples: int, seed: int, answerer=None) -> list[str]:
    """The calibration part of ``pydoc_data.topics`` (English prose shipped with Python)."""
    return drawn_documents(
        pydoc_documents("calibration", cfg.seq_len * CHARS_PER_TOKEN), n_samples, seed, "pydoc", cfg.seq_len
    )


@calibration_source("pydoc_chat", "text", schema.TextCalibrationConfig)
def pydoc_chat_calibration(cfg, tokenizer, n_samples: int, seed: int, answerer=None) -> list[str]:
    """The documents ``pydoc`` draws with the same seed, each rendered as a user/assistant chat."""
    documents = pydoc_documents("calibration", cfg.seq_len * CHARS_PER_TOKEN)
    chosen = drawn_documents(documents, n_samples, seed, "pydoc_chat", cfg.seq_len)
    return [document_as_chat(d, tokenizer) for d in chosen]


def check_text_file(cfg, key: str, n_samples: int | None) -> None:
    """The text file is UTF-8 text (its first :data:`~replaceme_exp.data.files.PREFLIGHT_BYTES`);
    read whole, it packs into ``n_samples`` documents."""
    text = check_text(f"{key}.path", cfg.path)
    if text is None or n_samples is None:
        return
    documents = pack_paragraphs(text, cfg.seq_len * CHARS_PER_TOKEN)
    if refusal := too_few(len(documents), n_samples, "text_file", cfg.seq_len):
        raise refusal


def readable_path(cfg, key: str) -> None:
    """``<key>.path`` names a file this process can open."""
    check_readable(f"{key}.path", getattr(cfg, "path", None))


def json_records_path(cfg, key: str) -> None:
    """``dataset: json`` reads the local file ``<key>.path``."""
    if getattr(cfg, "dataset", None) == "json":
        readable_path(cfg, key)


@calibration_source("text_file", "text", schema.FileCalibrationConfig, check=check_text_file, settings=readable_path)
def text_file_calibration(cfg, tokenizer, n_samples: int, seed: int, answerer=None) -> list[str]:
    """A user's plain text, paragraphs packed into documents of about ``seq_len`` tokens."""
    documents = text_file_documents(cfg.path, cfg.seq_len * CHARS_PER_TOKEN)
    return drawn_documents(documents, n_samples, seed, "text_file", cfg.seq_len)


def check_json_records(cfg, key: str, n_samples: int | None) -> None:
    """A local JSON file (``dataset: json``): each record, in the first
    :data:`~replaceme_exp.data.files.PREFLIGHT_BYTES` of each file, is a JSON object that renders to
    text with the configured fields (:func:`~replaceme_exp.data.sources.render_record`, the rule the
    job applies; the chat template aside)."""
    if cfg.dataset != "json":
        return
    paths = cfg.path if isinstance(cfg.path, list) else [cfg.path]
    if not all(isinstance(p, str) and p for p in paths):
        raise ConfigError(f"{key}.path", cfg.path, "set the path of a JSONL file")
    template, pairs = getattr(cfg, "text_template", None), getattr(cfg, "pair_fields", None)
    for path in paths:
        for where, record in JsonRecords(f"{key}.path", path, path, files.PREFLIGHT_BYTES).records():
            try:
                render_record(record, cfg.text_field, cfg.chat_field, None, template, cfg.chat_turns, pairs)
            except ConfigError as err:
                raise ConfigError(err.key, err.value, f"{where} of {path}: {err.reason}") from err


def dataset_hub_datasets(cfg, key: str) -> list[HubDataset]:
    if cfg.dataset == "json":
        return []
    return [HubDataset(f"{key}.dataset", cfg.dataset, cfg.dataset, getattr(cfg, "subset", None), instead=LOCAL_TEXT)]


@calibration_source(
    "hf_dataset",
    "text",
    schema.DatasetCalibrationConfig,
    schema.HubDatasetCalibrationConfig,
    schema.TemplatedDatasetCalibrationConfig,
    schema.JsonlCalibrationConfig,
    schema.OpenDatasetCalibrationConfig,
    check=check_json_records,
    hub_datasets=dataset_hub_datasets,
    settings=json_records_path,
)
def dataset_calibration(cfg, tokenizer, n_samples: int, seed: int, answerer=None) -> list[str]:
    """Records of a hub dataset, or of a local JSONL file (``dataset: json``), as text or chats."""
    data_files = getattr(cfg, "path", None) if cfg.dataset == "json" else None
    if cfg.dataset == "json" and not data_files:
        raise ConfigError("calibration.path", data_files, "set the path of a JSONL file")
    return hf_dataset_documents(
        path=cfg.dataset,
        name=getattr(cfg, "subset", None),
        split=cfg.split,
        data_files=data_files,
        text_field=cfg.text_field,
        chat_field=cfg.chat_field,
        text_template=getattr(cfg, "text_template", None),
        order=cfg.order,
        chat_turns=cfg.chat_turns,
        keep_empty=cfg.empty_records == "keep",
        pair_fields=getattr(cfg, "pair_fields", None),
        n_records=n_samples,
        seed=seed,
        streaming=bool(cfg.streaming),
        tokenizer=tokenizer,
        skip=int(getattr(cfg, "draw", 0) or 0) * n_samples,
    )


@calibration_source(
    "generated",
    "text",
    schema.GeneratedCalibrationConfig,
    schema.DatasetPromptsCalibrationConfig,
    check=check_prompts,
    hub_datasets=prompts_hub_datasets,
    settings=prompt_files,
)
def generated_calibration(cfg, tokenizer, n_samples: int, seed: int, answerer=None) -> list[str]:
    """Prompts answered by the model being pruned (``answerer``), as chats."""
    if answerer is None:
        raise ConfigError("calibration.source", "generated", "needs the model to answer its prompts")
    return self_generated_documents(cfg, tokenizer, answerer.model, answerer.identity, answerer.cache_dir)


def mix_parts(cfg, n_samples: int) -> list[tuple[str, schema.MixPartConfig, int]]:
    """The parts of a ``mix`` as (name, options, share of ``n_samples``): the last part takes the
    rest, the others ``n_samples x fraction`` rounded (``mix_order=concatenated``: rounded down, as
    the official ``_load_mixed_dataset``'s ``size // 2``); a part without ``seq_len`` takes the mix's."""
    out: list[tuple[str, schema.MixPartConfig, int]] = []
    parts = list(cfg.parts.items())
    rounded = math.floor if getattr(cfg, "mix_order", None) == "concatenated" else round
    for i, (name, raw) in enumerate(parts):
        part = build(schema.MixPartConfig, raw, f"calibration.parts.{name}")
        if part.seq_len is None:
            part = dataclasses.replace(part, seq_len=cfg.seq_len)
        part = dataclasses.replace(part, draw=int(getattr(cfg, "draw", 0) or 0))
        taken = sum(share for _, _, share in out)
        share = rounded(n_samples * Fraction(str(part.fraction))) if i < len(parts) - 1 else n_samples - taken
        out.append((name, part, share))
    return out


def check_mix(cfg, key: str, n_samples: int | None) -> None:
    for name, part, share in mix_parts(cfg, int(n_samples or cfg.n_samples)):
        CALIBRATION_SOURCES.get(part.source).check(part, f"{key}.parts.{name}", share if n_samples else None)


def mix_hub_datasets(cfg, key: str) -> list[HubDataset]:
    return [
        dataset
        for name, part, _ in mix_parts(cfg, int(cfg.n_samples))
        for dataset in CALIBRATION_SOURCES.get(part.source).hub_datasets(part, f"{key}.parts.{name}")
    ]


@calibration_source("mix", "text", schema.MixCalibrationConfig, check=check_mix, hub_datasets=mix_hub_datasets)
def mixed_calibration(cfg, tokenizer, n_samples: int, seed: int, answerer=None) -> list[str]:
    """Shares of ``n_samples`` from each of ``parts`` (the last part takes the rest), shuffled
    together, or with ``mix_order=concatenated`` one part after the other in their order."""
    documents: list[str] = []
    for i, (_, part, share) in enumerate(mix_parts(cfg, n_samples)):
        source = CALIBRATION_SOURCES.get(part.source)
        documents.extend(source.read(part, tokenizer, share, seed + i, answerer))
    if cfg.mix_order != "concatenated":
        random.Random(seed).shuffle(documents)
    return documents


# How each protocol reads and batches calibration records (the official code: utils.py takes the
# first dataset_size records in order, keeping empty ones (WikiText-2's blank lines), _load_orca_dataset
# the first user/assistant pair of each, _load_mixed_dataset the SlimOrca half then the FineWeb half,
# and its DataLoader(shuffle=False, drop_last=True) batches them as read, an incomplete last batch dropped).
RECORDS_AS_READ_BY = {
    "paper": {
        "order": "shuffled",
        "chat_turns": "all",
        "empty_records": "drop",
        "mix_order": "shuffled",
        "batch_order": "by_length",
        "drop_last": False,
    },
    "official": {
        "order": "first",
        "chat_turns": "first_pair",
        "empty_records": "keep",
        "mix_order": "concatenated",
        "batch_order": "as_read",
        "drop_last": True,
    },
}
# What each part of a mix reads as its protocol does, unless the part sets it.
PART_SETTINGS = ("order", "chat_turns", "empty_records")


def as_read_by(calibration: Any, protocol: str) -> Any:
    """The calibration option ``calibration`` with the keys it leaves to the protocol (null) settled
    as ``protocol`` reads and batches records; under ``protocol=official`` also each part of a
    ``mix`` that does not set its own order, turns or empty records."""
    settings = RECORDS_AS_READ_BY[protocol]
    found = {k: v for k, v in settings.items() if hasattr(calibration, k) and getattr(calibration, k) is None}
    parts = getattr(calibration, "parts", None)
    if protocol == "official" and isinstance(parts, dict):
        found["parts"] = {
            name: {**part, **{k: settings[k] for k in PART_SETTINGS if part.get(k) is None}}
            for name, part in parts.items()
        }
    return dataclasses.replace(calibration, **found) if found else calibration


SETTLED_BY_THE_PROTOCOL = ("order", "chat_turns", "empty_records", "mix_order", "batch_order", "drop_last", "parts")


def empty_records_act(calibration: Any) -> bool:
    """Whether ``calibration.empty_records`` can act: records read from a text field (a chat, a pair
    of fields or a template always renders to text)."""
    rendered = getattr(calibration, "text_template", None) or getattr(calibration, "pair_fields", None)
    return calibration.source == "hf_dataset" and getattr(calibration, "text_field", None) is not None and not rendered


@protocol_rule(*(f"calibration.{key}" for key in SETTLED_BY_THE_PROTOCOL))
def records_as_the_protocol_reads_them(config: schema.JobConfig) -> dict[str, Any]:
    """The job's calibration keys left to the protocol, settled by :func:`as_read_by`."""
    settled = as_read_by(config.calibration, config.protocol)
    return {
        f"calibration.{k}": getattr(settled, k)
        for k in SETTLED_BY_THE_PROTOCOL
        if hasattr(settled, k) and getattr(settled, k) != getattr(config.calibration, k)
    }


def sample_seed(cfg: schema.CalibrationConfig) -> int:
    """The seed that draws the calibration sample: ``calibration.seed`` for draw 0 (the sample every row had
    before draws existed), else a seed derived from (seed, draw) by SHA-256, so that no (seed, draw) pair
    draws the sample of another."""
    draw = int(getattr(cfg, "draw", 0) or 0)
    if draw == 0:
        return int(cfg.seed)
    return int(hashlib.sha256(f"calibration draw {int(cfg.seed)}:{draw}".encode()).hexdigest()[:8], 16)


def drawn(cfg):
    """``cfg`` (a calibration option) as its draw reads it: its ``seed`` the draw's sample seed, and records
    read in order (``order: first``) starting ``draw x n_samples`` records in (the draw-th slice)."""
    draw = int(getattr(cfg, "draw", 0) or 0)
    if draw == 0:
        return cfg
    return dataclasses.replace(cfg, seed=sample_seed(cfg))


def build_calibration(cfg: schema.TextCalibrationConfig, tokenizer, answerer: Answerer | None = None) -> TokenBatches:
    """Padded calibration batches: ``n_samples`` sequences of at most ``seq_len`` tokens from the
    configured source as its draw reads it (:func:`drawn`; ``answerer``: the model that answers the
    prompts of ``source: generated``)."""
    cfg = drawn(cfg)
    documents = CALIBRATION_SOURCES.get(cfg.source).read(cfg, tokenizer, cfg.n_samples, int(cfg.seed), answerer)
    batches = tokenize_documents(
        documents,
        tokenizer,
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        padding_side=cfg.padding_side,
        sort_by_length=cfg.batch_order == "by_length",
    )
    if cfg.drop_last and len(batches) > 1 and batches.batches[-1].input_ids.shape[0] < cfg.batch_size:
        batches = TokenBatches(batches.batches[:-1], batches.seq_len)
    if batches.n_tokens == 0:
        raise ConfigError("calibration", cfg.name, "the calibration text tokenises to no tokens")
    return batches


def heldout_windows(cfg: schema.EvalConfig, tokenizer) -> TokenBatches:
    """Windows of held-out text for perplexity and held-out distances (``eval`` group): each held-out
    document's own windows (``documents``: :func:`~replaceme_exp.data.batching.document_windows`), or
    full windows of one stream of text (``pydoc_heldout``, ``text_file``)."""
    max_chars = cfg.seq_len * CHARS_PER_TOKEN
    if cfg.text == "documents":
        documents = [(d.id, d.text) for d in heldout_documents()]
        windows = document_windows(
            documents, tokenizer, cfg.seq_len, cfg.max_windows, cfg.windows_per_document, cfg.batch_size
        )
        if len(windows) == 0:
            raise ConfigError("eval.max_windows", cfg.max_windows, "no held-out document gave a window")
        return windows
    if cfg.text == "pydoc_heldout":
        documents = pydoc_documents("heldout", max_chars)
    else:
        documents = text_file_documents(cfg.path, max_chars, key="eval.path")
    windows = pack_windows(documents, tokenizer, cfg.seq_len, cfg.max_windows, cfg.batch_size)
    if len(windows) == 0:
        raise ConfigError("eval.seq_len", cfg.seq_len, "the held-out text is shorter than one window")
    return windows


def healing_documents(cfg: schema.HealingDataConfig, tokenizer, context_length: int, seed: int) -> list[str]:
    """The documents that healing trains on (``healing.data``), in an order drawn by ``seed``:
    ``pydoc`` (the calibration part of ``pydoc_data.topics``, disjoint from the held-out part that
    perplexity is measured on), ``text_file`` (a user's text, ``healing.data.path``) or
    ``hf_dataset`` (the paper: C4 from the hub; ``n_documents`` records)."""
    max_chars = context_length * CHARS_PER_TOKEN
    if cfg.source in ("pydoc", "text_file"):
        documents = (
            text_file_documents(cfg.path, max_chars, key="healing.data.path")
            if cfg.source == "text_file"
            else pydoc_documents("calibration", max_chars)
        )
        random.Random(seed).shuffle(documents)
        return documents
    return hf_dataset_documents(
        path=cfg.dataset,
        name=cfg.subset,
        split=cfg.split,
        data_files=None,
        text_field=cfg.text_field,
        chat_field=None,
        n_records=cfg.n_documents,
        seed=seed,
        streaming=bool(cfg.streaming),
        tokenizer=tokenizer,
    )
