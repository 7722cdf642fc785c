"""Text sources: each returns a list of documents (strings) or records rendered to text.

- ``pydoc``: real English prose that ships with Python (``pydoc_data.topics``), split into a
  calibration part and a disjoint held-out part.
- ``pydoc_chat``: the same calibration documents, each rendered as a user/assistant chat with the
  model's chat template (:func:`document_as_chat`).
- ``text_file``: a user's plain text; paragraphs packed into documents.
- ``hf_dataset``: any ``datasets`` loader (hub ids such as SlimOrca or FineWeb, or ``json`` with
  local files); a record becomes text through its text field, or its chat field rendered with the
  model's chat template.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path
from typing import Any, Iterable

from replaceme_exp.data.files import JsonRecords, read_text
from replaceme_exp.errors import ConfigError

log = logging.getLogger(__name__)

HELDOUT_FRACTION = 0.2
ORDERS = ("shuffled", "first")
_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant", "system": "system"}
_ROLE_ALIASES |= {role: role for role in ("tool", "ipython", "developer", "function")}  # newer chat templates


def pack_paragraphs(text: str, max_chars: int) -> list[str]:
    """Split ``text`` at blank lines and pack consecutive paragraphs into documents of at most
    ``max_chars`` characters (a longer paragraph stays whole; truncation happens at tokenisation)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    documents: list[str] = []
    current = ""
    for paragraph in paragraphs:
        if current and len(current) + 2 + len(paragraph) > max_chars:
            documents.append(current)
            current = paragraph
        else:
            current = f"{current}\n\n{paragraph}" if current else paragraph
    if current:
        documents.append(current)
    return documents


def pydoc_text(part: str) -> str:
    """The calibration (first 80% of the paragraphs, topics in key order) or held-out (the rest)
    part of ``pydoc_data.topics``. The topics repeat some paragraphs; held-out paragraphs that
    also occur in the calibration part are dropped, so the two parts share no paragraph."""
    from pydoc_data.topics import topics

    paragraphs = [p.strip() for key in sorted(topics) for p in re.split(r"\n\s*\n", topics[key]) if p.strip()]
    total = sum(len(p) for p in paragraphs)
    cut, seen = 0, 0
    while seen < total * (1 - HELDOUT_FRACTION):
        seen += len(paragraphs[cut])
        cut += 1
    if part == "calibration":
        return "\n\n".join(paragraphs[:cut])
    if part == "heldout":
        calibration = set(paragraphs[:cut])
        return "\n\n".join(p for p in paragraphs[cut:] if p not in calibration)
    raise ConfigError("part", part, "choose calibration or heldout")


def pydoc_documents(part: str, max_chars: int) -> list[str]:
    return pack_paragraphs(pydoc_text(part), max_chars)


def text_file_documents(path: str | None, max_chars: int, key: str = "calibration.path") -> list[str]:
    """The UTF-8 text of ``path`` (:func:`~replaceme_exp.data.files.read_text`: one line naming
    ``key`` for a missing, unreadable, binary or empty file), paragraphs packed into documents."""
    if not path:
        raise ConfigError(key, path, "set the path of a UTF-8 text file")
    documents = pack_paragraphs(read_text(key, path, path), max_chars)
    if not documents:
        raise ConfigError(key, path, "the file holds no text")
    return documents


CHAT_TURNS = ("all", "first_pair")


def first_pair(messages: list[dict]) -> list[dict]:
    """The official ReplaceMe SlimOrca loader's dialog: the first turn if it is the user's, else
    the second (a system prompt is skipped), and the turn after it, as user and assistant."""
    i = 0 if messages and messages[0]["role"] == "user" else 1
    if len(messages) < i + 2:
        raise ConfigError("calibration.chat_turns", "first_pair", f"a record has no user/assistant pair: {messages}")
    return [
        {"role": "user", "content": messages[i]["content"]},
        {"role": "assistant", "content": messages[i + 1]["content"]},
    ]


def check_jsonl(file: Path, key: str = "calibration.path") -> None:
    """Every record of ``file`` (JSON lines, or one JSON array) is a JSON object of UTF-8 text,
    nested at most :data:`~replaceme_exp.data.files.MAX_JSON_DEPTH` levels, and there is one;
    otherwise one error naming ``key``, the file and the line (before ``datasets`` reads it with a
    less helpful message, or a traceback)."""
    for _ in JsonRecords(key, str(file), file).records():
        pass


def chat_messages(turns: Any, chat_field: str) -> list[dict]:
    """``turns`` (a record's ``chat_field``: ``{role, content}`` or ShareGPT ``{from, value}`` turns) as
    ``{role, content}`` messages with the chat template's role names; anything else is a ConfigError."""
    if not isinstance(turns, list):
        reason = f"must hold a list of turns, not {type(turns).__name__}: {turns!r:.80}"
        raise ConfigError("calibration.chat_field", chat_field, reason)
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise ConfigError("calibration.chat_field", chat_field, f"a turn is not a mapping: {turn!r:.80}")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role is None or content is None:
            raise ConfigError("calibration.chat_field", chat_field, f"a turn without role/content: {turn}")
        if role not in _ROLE_ALIASES:
            reason = f"unknown role {role!r}; known: {sorted(_ROLE_ALIASES)}"
            raise ConfigError("calibration.chat_field", chat_field, reason)
        messages.append({"role": _ROLE_ALIASES[role], "content": content})
    return messages


def render_chat(messages: list[dict], tokenizer) -> str:
    """``messages`` in the tokenizer's chat template, or as "role: content" paragraphs without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


def render_record(
    record: dict[str, Any],
    text_field: str | None,
    chat_field: str | None,
    tokenizer,
    text_template: str | None = None,
    chat_turns: str = "all",
    pair_fields: Any = None,
) -> str:
    """One dataset record as text: ``pair_fields`` ``[user, assistant]`` (two fields of the record,
    e.g. Aya's ``[inputs, targets]``) rendered as a two-turn chat, ``text_template`` filled with
    the record's fields (e.g.
    ``"{support}\nQuestion: {question}\nAnswer: {correct_answer}"``), ``record[text_field]``, or
    ``record[chat_field]`` (a list of ``{role, content}`` or ShareGPT ``{from, value}`` turns)
    rendered with the chat template; ``chat_turns="first_pair"`` keeps only the first
    user/assistant pair (:func:`first_pair`)."""
    if chat_turns not in CHAT_TURNS:
        raise ConfigError("calibration.chat_turns", chat_turns, f"choose one of {CHAT_TURNS}")
    if pair_fields:
        user, assistant = pair_fields
        if record.get(user) is None or record.get(assistant) is None:
            reason = f"a record lacks {user!r} or {assistant!r}; its keys: {sorted(record)}"
            raise ConfigError("calibration.pair_fields", list(pair_fields), reason)
        turns = [{"role": "user", "content": record[user]}, {"role": "assistant", "content": record[assistant]}]
        return render_record({"messages": turns}, None, "messages", tokenizer)
    if text_template:
        try:
            return text_template.format_map(record)
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigError(
                "calibration.text_template", text_template, f"cannot fill it ({err!r}); record keys: {sorted(record)}"
            ) from err
    if chat_field and record.get(chat_field):
        messages = chat_messages(record[chat_field], chat_field)
        return render_chat(first_pair(messages) if chat_turns == "first_pair" else messages, tokenizer)
    if text_field and record.get(text_field) is not None:
        return str(record[text_field])
    raise ConfigError(
        "calibration.text_field",
        text_field,
        f"record has neither text field {text_field!r} nor chat field {chat_field!r}; its keys: {sorted(record)}",
    )


CHAT_PROMPT = "Explain this part of the Python documentation."


def document_as_chat(document: str, tokenizer, prompt: str = CHAT_PROMPT) -> str:
    """``document`` as a two-turn chat rendered by :func:`render_record`: the first paragraph (up to
    the first blank line) is the user turn and the rest the assistant's; a single paragraph answers
    ``prompt``. Returns the text in the model's chat template ("role: content" turns without one)."""
    parts = re.split(r"\n\s*\n", document.strip(), maxsplit=1)
    user, assistant = parts if len(parts) == 2 else (prompt, parts[0])
    record = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}
    return render_record(record, None, "messages", tokenizer)


def dataset_records(
    *,
    path: str,
    name: str | None,
    split: str,
    data_files: Any,
    n_records: int,
    seed: int,
    streaming: bool,
    shuffle_buffer: int = 10_000,
    order: str = "shuffled",
    key: str = "calibration.path",
    skip: int = 0,
) -> list[dict[str, Any]]:
    """Up to ``n_records`` records of a ``datasets`` loader (a hub id, or ``json`` with local
    ``data_files``): drawn reproducibly by ``seed`` (``order="shuffled"``; streaming datasets
    through a seeded shuffle buffer), or the first ``n_records`` in the dataset's order
    (``order="first"``, as the official ReplaceMe loader's ``select(range(n))``; ``skip``: the
    ``n_records`` after the first ``skip``, another calibration draw's slice)."""
    if order not in ORDERS:
        raise ConfigError("calibration.order", order, f"choose one of {ORDERS}")
    import datasets

    kwargs: dict[str, Any] = {"split": split, "streaming": streaming}
    if name:
        kwargs["name"] = name
    if data_files:
        files = data_files if not isinstance(data_files, str) else [data_files]
        for file in files:
            if not Path(str(file)).expanduser().is_file():
                raise ConfigError(key, str(file), "no such file")
            if path == "json":
                check_jsonl(Path(str(file)).expanduser(), key)
        kwargs["data_files"] = [str(Path(str(f)).expanduser()) for f in files]
    dataset = datasets.load_dataset(path, **kwargs)
    if order == "first":
        first = range(min(skip, len(dataset)), min(skip + n_records, len(dataset))) if not streaming else None
        records: Iterable[dict] = dataset.skip(skip).take(n_records) if streaming else (dataset[i] for i in first)
    elif streaming:
        records = dataset.shuffle(seed=seed, buffer_size=shuffle_buffer).take(n_records)
    else:
        indices = list(range(len(dataset)))
        random.Random(seed).shuffle(indices)
        records = (dataset[i] for i in indices[:n_records])
    return list(records)


def hf_dataset_documents(
    *,
    path: str,
    name: str | None,
    split: str,
    data_files: Any,
    text_field: str | None,
    chat_field: str | None,
    n_records: int,
    seed: int,
    streaming: bool,
    tokenizer,
    shuffle_buffer: int = 10_000,
    text_template: str | None = None,
    order: str = "shuffled",
    chat_turns: str = "all",
    pair_fields: Any = None,
    keep_empty: bool = False,
    skip: int = 0,
) -> list[str]:
    """Up to ``n_records`` rendered records (:func:`dataset_records`, :func:`render_record`); those
    of blank text dropped, or with ``keep_empty`` kept (as the official loader keeps them)."""
    records = dataset_records(
        path=path,
        name=name,
        split=split,
        data_files=data_files,
        n_records=n_records,
        seed=seed,
        streaming=streaming,
        shuffle_buffer=shuffle_buffer,
        order=order,
        skip=skip,
    )
    documents = [
        render_record(r, text_field, chat_field, tokenizer, text_template, chat_turns, pair_fields) for r in records
    ]
    if not keep_empty:
        documents = [d for d in documents if d.strip()]
    if not any(d.strip() for d in documents):
        raise ConfigError("calibration.path", data_files or path, "the dataset yielded no text")
    return documents


def first_user_turn(record: dict[str, Any], chat_field: str | None, text_field: str | None, key: str) -> str:
    """A record's prompt: the first user turn of its ``chat_field`` conversation (``{role,
    content}`` or ShareGPT ``{from, value}`` turns; a system turn is skipped), else its
    ``text_field``."""
    if chat_field and isinstance(record.get(chat_field), list):
        for turn in record[chat_field]:
            role = turn.get("role", turn.get("from")) if isinstance(turn, dict) else None
            if _ROLE_ALIASES.get(role) == "user":
                return str(turn.get("content", turn.get("value")))
        raise ConfigError(key, chat_field, f"a conversation has no user turn: {record[chat_field]!r:.120}")
    if text_field and record.get(text_field) is not None:
        return str(record[text_field])
    raise ConfigError(key, chat_field or text_field, f"a record has neither; its keys: {sorted(record)}")


def render_prompts(tokenizer, prompts: list[str]) -> list[str]:
    """Each prompt as one user turn in the chat template (with the assistant's turn opened), or
    as plain text when the tokenizer has no chat template."""
    if getattr(tokenizer, "chat_template", None):
        return [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
    return list(prompts)
