"""A user's input files (calibration text, JSON lines, prompts, held-out and healing text), read in
chunks with every problem said in one line naming the key, the file and, where there is one, the
line: missing or unreadable, empty, not UTF-8, NUL bytes (a binary file), a JSON line that does not
parse, is not an object or is nested deeper than :data:`MAX_JSON_DEPTH` levels.

Before the model loads a file is read up to :data:`PREFLIGHT_BYTES` (``limit``): what lies within
is checked line by line, what lies beyond is checked by the same code when the job reads the whole
file (:func:`read_text` and ``limit=None``), so the messages are the same either way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from replaceme_exp.errors import ConfigError

# Bytes of each file read before the model loads: a bigger file's head is checked there, the rest
# when the job reads it.
PREFLIGHT_BYTES = 64 * 2**20
# JSON records nested deeper are refused (pyarrow, which datasets reads JSON lines with, fails at
# 64 levels with a traceback; a chat record has 3).
MAX_JSON_DEPTH = 32
_CHUNK = 2**20


def open_file(key: str, value: Any, path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading (binary); a missing, non-regular or unreadable file raises one
    :class:`ConfigError` naming ``key`` and ``value`` (the configured spelling of the path)."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(key, value, "no such file")
    if not file.is_file():
        raise ConfigError(key, value, "is a directory, not a file" if file.is_dir() else "is not a regular file")
    try:
        return open(file, "rb")
    except OSError as err:
        raise ConfigError(key, value, f"cannot be read ({err.strerror or err})") from err


def check_readable(key: str, value: Any) -> None:
    """``value`` (a path, or a non-empty list of paths) names files this process can open."""
    paths = value if isinstance(value, list) and value else [value]
    for path in paths:
        if not isinstance(path, str) or not path:
            raise ConfigError(key, value, "no such file")
        open_file(key, path, path).close()


class TextFile:
    """The UTF-8 text of a user's file, line by line: ``lines()`` yields ``(number, line)`` (without
    the line break) from the first ``limit`` bytes (None: all of them); ``complete`` tells, after
    the lines were read, whether that was the whole file. A leading byte-order mark is dropped."""

    def __init__(self, key: str, value: Any, path: str | os.PathLike, limit: int | None = None):
        self.key, self.value, self.path, self.limit = key, value, Path(path).expanduser(), limit
        self.complete = False

    def fail(self, reason: str) -> ConfigError:
        return ConfigError(self.key, self.value, reason)

    def chunks(self) -> Iterator[str]:
        """The decoded text in pieces (a multi-byte character split between two reads is joined)."""
        with open_file(self.key, self.value, self.path) as f:
            consumed, tail, line = 0, b"", 1
            while True:
                budget = _CHUNK if self.limit is None else min(_CHUNK, self.limit - consumed)
                try:
                    raw = f.read(budget) if budget > 0 else b""
                    if budget <= 0:  # the limit: what follows (a character cut there too) is read later
                        self.complete = not tail and f.read(1) == b""
                        return
                except OSError as err:
                    raise self.fail(f"cannot be read ({err.strerror or err})") from err
                at_end = not raw
                data, base = tail + raw, consumed - len(tail)
                consumed += len(raw)
                try:
                    text, tail = data.decode("utf-8"), b""
                except UnicodeDecodeError as err:
                    if err.reason != "unexpected end of data" or at_end:
                        where = line + data[: err.start].count(b"\n")
                        reason = f"line {where} is not UTF-8 text (byte {base + err.start}): a binary file?"
                        raise self.fail(reason) from err
                    text, tail = data[: err.start].decode("utf-8"), data[err.start :]  # a character split by the read
                if "\x00" in text:
                    where = line + text[: text.index("\x00")].count("\n")
                    raise self.fail(f"line {where} holds NUL bytes: a binary file, not text")
                line += text.count("\n")
                if text:
                    yield text
                if at_end:
                    self.complete = True
                    return

    def lines(self) -> Iterator[tuple[int, str]]:
        pending, number, first = "", 1, True
        for text in self.chunks():
            if first:
                text, first = text.removeprefix("\ufeff"), False
            parts = (pending + text).split("\n")
            pending = parts.pop()
            for part in parts:
                yield number, part.removesuffix("\r")
                number += 1
        if pending and self.complete:  # a last line cut by the limit is left to the full read
            yield number, pending.removesuffix("\r")


def read_text(key: str, value: Any, path: str | os.PathLike) -> str:
    """The whole UTF-8 text of ``path`` (checked as :class:`TextFile` checks it); a file without
    text (empty, or blank lines only) is refused."""
    text = "".join(TextFile(key, value, path).chunks()).removeprefix("\ufeff")
    if not text.strip():
        raise ConfigError(key, value, "holds no text" + (" (the file is empty)" if not text else ""))
    return text


def check_text(key: str, value: Any) -> str | None:
    """``value`` names a readable UTF-8 text file without NUL bytes, that holds text (checked in its
    first :data:`PREFLIGHT_BYTES`). Returns its text when that was all of it, else None."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "set the path of a UTF-8 text file")
    reader = TextFile(key, value, value, PREFLIGHT_BYTES)
    text = "".join(reader.chunks()).removeprefix("\ufeff")
    if not text.strip() and reader.complete:
        raise ConfigError(key, value, "holds no text" + (" (the file is empty)" if not text else ""))
    return text if reader.complete else None


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests objects and arrays more than ``limit`` levels deep."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


class JsonRecords:
    """The records of a JSON file: JSON lines (one object per non-blank line), or one JSON array
    of objects. ``records()`` yields ``(where, record)``, ``where`` naming the line ("line 3") or
    the array element ("record 3"), from the first ``limit`` bytes (an array bigger than that is
    left to the full read); ``complete`` tells whether that was the whole file. A file without a
    record is refused."""

    def __init__(self, key: str, value: Any, path: str | os.PathLike, limit: int | None = None):
        self.key, self.value, self.path, self.limit = key, value, Path(path).expanduser(), limit
        self.complete = False

    def fail(self, reason: str) -> ConfigError:
        return ConfigError(self.key, self.value, reason)

    def parsed(self, text: str, where: str) -> Any:
        try:
            return json.loads(text)
        except RecursionError as err:
            raise self.fail(f"{where} is nested deeper than {MAX_JSON_DEPTH} levels") from err
        except json.JSONDecodeError as err:
            raise self.fail(f"{where} is not valid JSON ({err.msg})") from err

    def checked(self, record: Any, where: str) -> dict:
        if not isinstance(record, dict):
            raise self.fail(f"{where} is not a JSON object")
        if too_deep(record):
            raise self.fail(f"{where} is nested deeper than {MAX_JSON_DEPTH} levels")
        return record

    def is_array(self) -> bool:
        with open_file(self.key, self.value, self.path) as f:
            return f.read(4096).lstrip().removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"["

    def records(self) -> Iterator[tuple[str, dict]]:
        found = False
        if self.is_array():
            if self.limit is not None and self.path.stat().st_size > self.limit:
                return  # checked whole when the job reads it
            reader = TextFile(self.key, self.value, self.path)
            array = self.parsed("".join(reader.chunks()).removeprefix("\ufeff"), "the file")
            if not isinstance(array, list):
                raise self.fail("is neither JSON lines nor one JSON array of records")
            for i, record in enumerate(array, start=1):
                found = True
                yield f"record {i}", self.checked(record, f"record {i}")
            self.complete = True
        else:
            reader = TextFile(self.key, self.value, self.path, self.limit)
            for number, line in reader.lines():
                if line.strip():
                    found = True
                    where = f"line {number}"
                    yield where, self.checked(self.parsed(line, where), where)
            self.complete = reader.complete
        if not found and self.complete:
            raise self.fail("holds no record")
