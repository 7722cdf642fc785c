"""Stop signals: while a job runs, SIGTERM (a scheduler's) and SIGINT (Ctrl-C) raise
:class:`JobInterrupted` in it, so the job becomes a failed row and a failed W&B run before the
process stops. A second stop signal, at any time after the first (recording the failed row, a W&B
upload, the next job of a sweep), ends the process at once with one line on stderr and exit code
128 + the signal's number: nothing of the process can hold it back, not even code that catches
the first one. While a finished or failed job's row is written (:func:`stop_signals_deferred`), a
first stop signal waits for the row, then stops the process. A SIGTERM within :data:`SAME_STOP_S` of
the first stop signal is the same request, not a second one: SLURM, cancelling or preempting a job,
signals both ``srun`` and its task, and ``srun`` forwards, so the task sees two SIGTERMs milliseconds
apart (measured on a one-node cluster)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SAME_STOP_S = 2.0
_first_stop_at: list[float] = []  # when the first stop signal came (time.monotonic), once it came


class JobInterrupted(Exception):
    """The job's process was asked to stop; ``row`` (set by the runner) is its failed row."""

    row: dict | None = None


def exit_at_once(signum, frame) -> None:
    """The second stop signal: one line, then ``os._exit`` (no cleanup, no exception to catch); a
    SIGTERM within :data:`SAME_STOP_S` of the first stop signal is ignored (the same request)."""
    if signum == signal.SIGTERM and _first_stop_at and time.monotonic() - _first_stop_at[0] < SAME_STOP_S:
        return
    name = signal.Signals(signum).name
    try:
        sys.stderr.write(f"\n{name} again: stopped at once (the interrupted job's row may be missing)\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + signum)


def second_signal_exits() -> None:
    """From now on a stop signal ends the process at once (:func:`exit_at_once`; main thread only)."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, exit_at_once)


@contextmanager
def stop_signals_raise():
    """SIGTERM and SIGINT raise :class:`JobInterrupted` in the block (main thread only); the first
    one also makes the next one end the process at once (:func:`second_signal_exits`, for the rest
    of the process). Without a signal, the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopped = []

    def interrupt(signum, frame):
        stopped.append(signum)
        _first_stop_at[:] = [time.monotonic()]
        second_signal_exits()
        raise JobInterrupted(f"stopped by {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        if not stopped:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@contextmanager
def stop_signals_deferred():
    """SIGTERM and SIGINT in the block are held until it ends (a failed job's row being written when
    a launcher stops every rank), then raise :class:`JobInterrupted`; a second one ends the process at
    once (:func:`second_signal_exits`). Without a signal, the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []

    def hold(signum, frame):
        held.append(signum)
        _first_stop_at[:] = [time.monotonic()]
        second_signal_exits()

    previous = {sig: signal.signal(sig, hold) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        if not held:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if held:
        raise JobInterrupted(f"stopped by {signal.Signals(held[0]).name}")
