"""What runs now: the code that does a piece of work announces it, whoever keeps time listens.

``with stage("capture", "capture (selection)"):`` marks a stage of kind ``capture`` (the row sums
time and energy per kind: ``load``, ``data``, ``capture``, ``estimate``, ``surgery``, ``heal``,
``eval``, ``save``, ``analysis``) under a label that says what runs. Stage code never takes a
timer: a job's clock (:class:`~replaceme_exp.pipeline.clock.StageClock`) observes the stages
announced while it is installed (:func:`observed_by`); with no observer a stage costs nothing.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, ContextManager, Iterator

Observer = Callable[[str, str], ContextManager]
_observers: list[Observer] = []


@contextmanager
def stage(kind: str, label: str | None = None) -> Iterator[None]:
    """Announce a stage of ``kind`` named ``label`` (default: the kind) around its work."""
    with ExitStack() as stack:
        for observer in list(_observers):
            stack.enter_context(observer(kind, label or kind))
        yield


@contextmanager
def observed_by(observer: Observer) -> Iterator[None]:
    """``observer(kind, label)`` (a context manager) wraps every stage announced in the block."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
