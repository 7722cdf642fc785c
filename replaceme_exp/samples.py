"""Text samples a job shows as it makes them (the model's own answers that calibrate it, its
generated answers in evaluation): the code that makes them publishes a small table, whoever
records the job listens (its W&B run logs each as a ``wandb.Table``). Without a listener,
publishing costs nothing.

    publish("calibration_generated", ["prompt", "answer"], list(zip(prompts, answers)))
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

log = logging.getLogger(__name__)

Listener = Callable[[str, list[str], list[list]], None]
_listeners: list[Listener] = []


def publish(name: str, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    """Hand the table ``name`` (``columns``; one list of cells per row) to every listener; a
    listener that raises is logged and dropped (showing samples must not cost the job)."""
    if not _listeners:
        return
    table = [list(r) for r in rows]
    for listener in list(_listeners):
        try:
            listener(name, list(columns), table)
        except Exception as err:  # noqa: BLE001
            log.warning("samples listener %r failed (%s); dropped", listener, err)
            _listeners.remove(listener)


@contextmanager
def samples_listener(listener: Listener) -> Iterator[None]:
    """``listener(name, columns, rows)`` hears every table published in the block."""
    _listeners.append(listener)
    try:
        yield
    finally:
        if listener in _listeners:
            _listeners.remove(listener)
