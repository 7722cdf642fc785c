"""Progress of long loops (capture, held-out passes, perplexity, lm-eval, numerical solvers) that a
person can follow both on a terminal and in a log file.

``mode`` (``progress.mode`` of the config, set by :func:`configure_from` at job start):

- ``auto`` (default): a tqdm bar when stderr is a terminal, log lines otherwise (SLURM, a file);
- ``bar``: always the tqdm bar; ``log``: always log lines; ``off``: nothing.

Log lines go to the ``replaceme_exp.progress`` logger at INFO, one each time the loop crosses
another ``every_percent`` percent or ``every_seconds`` have passed since the last line, whichever
comes first (only the time rule when the total is unknown; a background thread says it also while
one step takes longer), and one when the loop ends::

    capture (selection): 40/128 batches (31%), 12.3 s elapsed, ~27 s left
    capture (selection): 128/128 batches done in 39.5 s

Use :func:`progress` around an iterable, or :class:`Progress` (a context manager with
``update(n)``) where the work is not one python loop. Listeners (:func:`add_listener`, e.g. a
tracker's ``progress(desc, done, total)``) are called at the same points, in ``bar`` mode too.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, TypeVar

log = logging.getLogger(__name__)

MODES = ("auto", "bar", "log", "off")
_settings: dict[str, Any] = {"mode": "auto", "every_percent": 10.0, "every_seconds": 30.0}
_listeners: list[Callable[[str, int, "int | None"], None]] = []

T = TypeVar("T")


def configure(every_percent: float | None = None, every_seconds: float | None = None, mode: str | None = None) -> None:
    """Set the module defaults (None keeps a value as it is)."""
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r}: choose one of {', '.join(MODES)}")
        _settings["mode"] = mode
    if every_percent is not None:
        if not 0 < float(every_percent) <= 100:
            raise ValueError(f"progress every_percent {every_percent!r}: must be in (0, 100]")
        _settings["every_percent"] = float(every_percent)
    if every_seconds is not None:
        if not (math.isfinite(float(every_seconds)) and float(every_seconds) > 0):
            raise ValueError(f"progress every_seconds {every_seconds!r}: must be a finite number > 0")
        _settings["every_seconds"] = float(every_seconds)


def configure_from(settings) -> None:
    """:func:`configure` from the config's ``progress`` block (its ``mode``, ``every_percent`` and
    ``every_seconds``)."""
    configure(every_percent=settings.every_percent, every_seconds=settings.every_seconds, mode=settings.mode)


def settings() -> dict[str, Any]:
    return dict(_settings)


def add_listener(listener: Callable[[str, int, "int | None"], None]) -> None:
    """Call ``listener(desc, done, total)`` wherever a log line is due and at the end of each loop
    (not in ``off`` mode); an exception in a listener is logged once and the listener dropped."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: Callable[[str, int, "int | None"], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


@contextmanager
def progress_listener(listener: Callable[[str, int, "int | None"], None]) -> Iterator[None]:
    """:func:`add_listener` for the duration of a ``with`` block (e.g. a job's W&B run)."""
    add_listener(listener)
    try:
        yield
    finally:
        remove_listener(listener)


def quiet_library_bars() -> None:
    """Turn off the tqdm bars of transformers (``Loading weights``), huggingface_hub and datasets
    when progress is not a bar: in a log file they are lines of carriage returns.

    Nothing is imported for this (the load imports transformers; most jobs never load datasets):
    a library already imported has its bars turned off; otherwise an environment variable it reads
    when imported does it (``HF_HUB_DISABLE_PROGRESS_BARS=1``, which transformers follows, and
    ``HF_DATASETS_DISABLE_PROGRESS_BARS=1``), unless it is set."""
    if resolved_mode() == "bar":
        return
    if (transformers := sys.modules.get("transformers")) is not None:
        transformers.utils.logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    datasets = sys.modules.get("datasets")
    if datasets is not None and hasattr(datasets, "disable_progress_bars"):
        datasets.disable_progress_bars()
    else:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def _notify(desc: str, done: int, total: int | None) -> None:
    for listener in list(_listeners):
        try:
            listener(desc, done, total)
        except Exception as err:  # noqa: BLE001 - reporting must not cost the job
            log.warning("progress listener %r failed (%s); dropped", listener, err)
            remove_listener(listener)


def _stderr_is_terminal() -> bool:
    stream = sys.stderr
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def resolved_mode(mode: str | None = None) -> str:
    """``bar``, ``log`` or ``off``: ``mode`` (default: the configured one) with ``auto`` decided
    by whether stderr is a terminal."""
    mode = mode or _settings["mode"]
    if mode == "auto":
        return "bar" if _stderr_is_terminal() else "log"
    return mode


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "x", "ch", "sh")) else "s")


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


class Progress:
    """A counter with a tqdm bar or log lines (see the module docstring). ``update(n)`` counts
    ``n`` more; leaving the ``with`` block normally logs the final line (after an exception, only
    the bar is closed: the caller reports the error)."""

    def __init__(
        self,
        total: int | None,
        desc: str = "",
        unit: str = "item",
        mode: str | None = None,
        every_percent: float | None = None,
        every_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = int(total) if total is not None and total > 0 else None
        self.desc, self.unit, self.count = desc or "progress", unit, 0
        self.mode = resolved_mode(mode)
        self.every_percent = float(every_percent or _settings["every_percent"])
        self.every_seconds = float(every_seconds or _settings["every_seconds"])
        self.clock = clock
        self.start = self.last_time = clock()
        self.next_percent = self.every_percent
        self.bar = None
        self.closed = False
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        if self.mode == "log" and clock is time.monotonic:  # a test's fake clock is read only by update()
            threading.Thread(target=self._heartbeat, name=f"progress {self.desc}", daemon=True).start()
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=desc, unit=unit, leave=False, disable=False)

    def _line(self, now: float) -> str:
        elapsed = now - self.start
        if self.total is None:
            return f"{self.desc}: {self.count} {_plural(self.unit)}, {format_seconds(elapsed)} elapsed"
        percent = 100 * self.count / self.total
        line = f"{self.desc}: {self.count}/{self.total} {_plural(self.unit)} ({percent:.0f}%)"
        line += f", {format_seconds(elapsed)} elapsed"
        if 0 < self.count < self.total:
            line += f", ~{format_seconds(elapsed / self.count * (self.total - self.count))} left"
        return line

    def _heartbeat(self) -> None:
        """In ``log`` mode, a line whenever ``every_seconds`` pass without one, also while one step
        of the loop (a batch through a model on a busy CPU) takes longer than that."""
        while not self._stopped.wait(min(1.0, self.every_seconds)):
            with self._lock:
                now = self.clock()
                if self.closed or now - self.last_time < self.every_seconds:
                    continue
                self.last_time = now
                log.info(self._line(now))

    def update(self, n: int = 1) -> None:
        with self._lock:
            self._update(n)

    def _update(self, n: int) -> None:
        if n <= 0 or self.closed:
            return
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
        if self.mode == "off" or (self.mode == "bar" and not _listeners):
            return
        if self.total is not None and self.count >= self.total:
            return  # the final line says it
        now = self.clock()
        due = now - self.last_time >= self.every_seconds
        if self.total is not None:
            percent = 100 * self.count / self.total
            if percent >= self.next_percent:
                due = True
                self.next_percent = (math.floor(percent / self.every_percent) + 1) * self.every_percent
        if due:
            self.last_time = now
            if self.mode == "log":
                log.info(self._line(now))
            _notify(self.desc, self.count, self.total)

    def close(self, finished: bool = True) -> None:
        self._stopped.set()
        with self._lock:
            self._close(finished)

    def _close(self, finished: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        if not finished or self.mode == "off":
            return
        if self.mode == "log":
            elapsed = format_seconds(self.clock() - self.start)
            done = f"{self.count}/{self.total}" if self.total is not None else str(self.count)
            log.info(f"{self.desc}: {done} {_plural(self.unit)} done in {elapsed}")
        _notify(self.desc, self.count, self.total)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(finished=exc_type is None)


def progress(
    iterable: Iterable[T], total: int | None = None, desc: str = "", unit: str = "batch", **kwargs
) -> Iterator[T]:
    """Yield the items of ``iterable`` with progress (``total`` defaults to its ``len``)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    counter = Progress(total, desc, unit, **kwargs)
    finished = False
    try:
        for item in iterable:
            yield item
            counter.update(1)
        finished = True
    finally:
        counter.close(finished=finished)


def progress_counter(total: int | None, desc: str = "", unit: str = "item", **kwargs) -> Progress:
    """A :class:`Progress` for work that is not one python loop: ``with progress_counter(n, "x")
    as p: ... p.update(k)``."""
    return Progress(total, desc, unit, **kwargs)


def token_steps(counter: Progress, rows: int):
    """A ``transformers`` stopping criterion that stops nothing: each decoding step of
    ``model.generate`` counts ``rows`` tokens (one per sequence of the batch) on ``counter``, so
    its time and percent rules fire inside one ``generate`` call. Pass it in a list as
    ``stopping_criteria``; :attr:`steps` is the number of steps seen."""
    import torch
    from transformers import StoppingCriteria

    class TokenSteps(StoppingCriteria):
        steps = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.steps += 1
            counter.update(rows)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return TokenSteps()
