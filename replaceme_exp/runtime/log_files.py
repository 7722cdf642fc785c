"""Tracebacks in the job's log file, one line on the console; a job prefix on parallel consoles.

A job that fails by the project's own bug logs its traceback for whoever debugs it, but a person
watching the console reads one line: records marked :data:`FILE_ONLY` reach the log files
(Hydra's ``<job_dir>/run.log``) and not the console, when the process has a log file at all.

Jobs run side by side (the joblib launcher, ``hydra/launcher=local_parallel``) share one console:
:func:`prefix_console` starts each of a job's console lines with ``[job <n>] ``; its ``run.log``
stays unprefixed.
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


class _Prefixed(logging.Formatter):
    """``inner``'s text with ``prefix`` at the start of each of its lines."""

    def __init__(self, inner: logging.Formatter | None, prefix: str):
        super().__init__()
        self.inner, self.prefix = inner or logging.Formatter(), prefix

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(self.prefix + line for line in self.inner.format(record).split("\n"))


def prefix_console(prefix: str) -> None:
    """Start every line the root logger's console handlers print with ``prefix`` (the log files'
    lines stay as they are); idempotent for one prefix."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            _prefix_handler(handler, prefix)


def prefix_logs(prefix: str) -> None:
    """Start every line of the root logger's handlers, console and files, with ``prefix`` (a rank's
    ``[rank r/N] ``); idempotent for one prefix."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            _prefix_handler(handler, prefix)


def _prefix_handler(handler: logging.Handler, prefix: str) -> None:
    current = handler.formatter
    if isinstance(current, _Prefixed):
        current.prefix = prefix
    else:
        handler.setFormatter(_Prefixed(current, prefix))
