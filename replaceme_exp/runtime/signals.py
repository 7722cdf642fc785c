"""Stop signals: while a job runs, SIGTERM (a scheduler's) and SIGINT (Ctrl-C) raise
:class:`JobInterrupted` in it, so the job becomes a failed row and a failed W&B run before the
process stops."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class JobInterrupted(Exception):
    """The job's process was asked to stop; ``row`` (set by the runner) is its failed row."""

    row: dict | None = None


@contextmanager
def stop_signals_raise():
    """SIGTERM and SIGINT raise :class:`JobInterrupted` in the block (main thread only; the previous
    handlers come back afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise JobInterrupted(f"stopped by {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
