"""File and folder names of the reports, made from values a row or the command line holds (a
model, calibration or eval name, a sweep id, a setting): each becomes one safe name, so a report
writes only under its output folder, whatever the rows say (``calibration.name=../../..``)."""

from __future__ import annotations

import hashlib
import re

MAX_LENGTH = 100  # well under the 255 bytes a file name may have, with room for a suffix
_HASH = 8


def file_name(name: object) -> str:
    """``name`` as one file-name component. A name of letters, digits, ``.``, ``_`` and ``-`` that
    does not start with a dot or ``_`` (``tiny_llama``, ``2026-11-22_10-18-33``) is kept as it is,
    up to :data:`MAX_LENGTH` characters. Any other becomes one: each run of other characters or of
    two or more dots turns into ``_`` (so no ``/`` and no ``..``), leading dots and underscores are
    dropped (never ``.`` nor a hidden file), it is cut to fit, and a short hash of the original is
    appended, so two names never share a file (``../../..`` -> ``unnamed_<hash>``)."""
    text = str(name)
    safe = re.sub(r"(?:[^A-Za-z0-9._-]|\.{2,})+", "_", text).lstrip("._").rstrip("_")
    if safe and safe == text and len(text) <= MAX_LENGTH:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:_HASH]
    return f"{(safe or 'unnamed')[: MAX_LENGTH - _HASH - 1]}_{digest}"
