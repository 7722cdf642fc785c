"""What runs now: the code that does a piece of work announces it, whoever keeps time listens.

``with stage("capture", "capture (selection)"):`` marks a stage of kind ``capture`` (the row sums
time and energy per kind: ``load``, ``data``, ``capture``, ``estimate``, ``surgery``, ``heal``,
``eval``, ``save``, ``analysis``) under a label that says what runs. Stage code never takes a
timer: a job's clock (:class:`~replaceme_exp.pipeline.clock.StageClock`) observes the stages
announced while it is installed (:func:`observed_by`); with no observer a stage costs nothing.
``with stage(...) as cost:`` gives the :class:`StageCost` a job's clock books to the stage, filled in
when the stage ends (empty without a clock): work that keeps its result for later jobs (a search's
steps) keeps what it cost beside it.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator

Observer = Callable[[str, str], ContextManager]
_observers: list[Observer] = []


@dataclass
class StageCost:
    """What a stage cost: wall seconds, energy (kWh) and CO2 (kg); None where nothing measured it
    (no clock, no CodeCarbon)."""

    seconds: float | None = None
    energy_kwh: float | None = None
    co2_kg: float | None = None


@contextmanager
def stage(kind: str, label: str | None = None) -> Iterator[StageCost]:
    """Announce a stage of ``kind`` named ``label`` (default: the kind) around its work. Yields the
    cost the first observer that measures costs (one yielding a :class:`StageCost`) fills in at
    the stage's end."""
    with ExitStack() as stack:
        costs = [stack.enter_context(observer(kind, label or kind)) for observer in list(_observers)]
        yield next((c for c in costs if isinstance(c, StageCost)), StageCost())


@contextmanager
def observed_by(observer: Observer) -> Iterator[None]:
    """``observer(kind, label)`` (a context manager) wraps every stage announced in the block."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
