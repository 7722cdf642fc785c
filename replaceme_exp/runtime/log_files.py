"""Tracebacks in the job's log file, one line on the console.

A job that fails by the project's own bug logs its traceback for whoever debugs it, but a person
watching the console reads one line: records marked :data:`FILE_ONLY` reach the log files
(Hydra's ``<job_dir>/run.log``) and not the console, when the process has a log file at all.
"""

from __future__ import annotations

import logging

FILE_ONLY = {"file_only": True}


class _SkipFileOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)


def log_files() -> list[str]:
    """The files the root logger writes to."""
    return [h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


def console_skips_file_only() -> None:
    """Keep :data:`FILE_ONLY` records off the root logger's console handlers, when it has a log
    file to hold them (idempotent)."""
    root = logging.getLogger()
    if not log_files():
        return
    for handler in root.handlers:
        console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if console and not any(isinstance(f, _SkipFileOnly) for f in handler.filters):
            handler.addFilter(_SkipFileOnly())
