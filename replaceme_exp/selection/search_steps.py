"""The finished steps of a greedy search, kept on disk so that no job computes one twice.

A greedy search's step depends only on the model, the calibration tokens, the search's settings
and the blocks removed before it: a job killed after step 5 resumes at step 6, and a search for 11
blocks takes the first 8 steps of the search for 8 blocks of the same model and data. Each entry
holds the step's result and what it cost when it was computed (:class:`~replaceme_exp.stages.StageCost`),
so that a row of a search that reused steps records their cost (:func:`reused_columns`) and its
compression time stays the method's whole cost, not what this job happened to pay.

Entries are keyed as the statistics cache's (model weights by content, calibration token ids, and the
version of its step's semantics that the search declares in its :class:`StepKey`) and checked the same way
(:func:`~replaceme_exp.storage.read_keyed_json`): a corrupt entry or one holding another key is
reported, removed and recomputed. ``capture.search_steps=false`` keeps none, ``force=true``
recomputes and overwrites.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from replaceme_exp.stages import StageCost
from replaceme_exp.storage import (
    content_key,
    discard_entry,
    read_keyed_json,
    remove_dead_temporaries,
    write_keyed_json,
    write_optional,
)

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class StepKey:
    """One step of one search: ``search`` (its name), ``version`` (the search's own version of what a
    step computes: bumped by the search when its code changes that, so that older entries are
    recomputed), ``settings`` (every setting of the search that can change a step, JSON-able),
    ``before`` (the original indices of the blocks removed before this step, in the order removed)."""

    search: str
    version: int
    settings: dict
    before: tuple[int, ...]


class SearchSteps:
    """The step store under ``root`` for one model (``model_hash``) and calibration set
    (``data_hash``). ``enabled=False``: nothing read or written; ``refresh``: nothing read."""

    def __init__(
        self, root: str | os.PathLike, model_hash: str, data_hash: str, enabled: bool = True, refresh: bool = False
    ):
        self.root = Path(root)
        self.model_hash, self.data_hash, self.enabled, self.refresh = model_hash, data_hash, enabled, refresh
        self.writable = enabled
        if enabled and self.root.is_dir():
            remove_dead_temporaries(self.root)

    def _entry(self, step: StepKey) -> tuple[Path, dict]:
        key = {
            "model": self.model_hash,
            "data": self.data_hash,
            "search": step.search,
            "version": step.version,
            "settings": step.settings,
            "before": list(step.before),
        }
        return self.root / f"{step.search}-step-{content_key(key, 24)}.json", key

    def get(self, step: StepKey, valid: Callable[[Any], bool] = lambda result: True) -> tuple[Any, StageCost] | None:
        """The stored result of ``step`` and what computing it cost; None when not stored, or when
        the entry's value is not of the shape this code writes (``valid(result)`` false: reported,
        removed and recomputed, as an entry that fails its checksum)."""
        if not self.enabled or self.refresh:
            return None
        path, key = self._entry(step)
        found = read_keyed_json(path, key, "search step")
        if found is None:
            return None
        try:
            result, cost = found["result"], StageCost(**found["cost"])
            if not valid(result):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            discard_entry(path, "search step", "holds a value of another shape")
            return None
        return result, cost

    def put(self, step: StepKey, result: Any, cost: StageCost) -> None:
        """Keep ``result`` (JSON-able) of ``step`` and what it cost; a failed write is one warning."""
        if not self.writable:
            return
        path, key = self._entry(step)
        value = {"result": result, "cost": vars(cost)}
        if not write_optional("search step", path, lambda: write_keyed_json(path, key, value)):
            self.writable = False


def no_steps() -> SearchSteps:
    """A store that keeps nothing (a search run outside a job)."""
    return SearchSteps(".", "", "", enabled=False)


def reused_columns(costs: list[StageCost]) -> dict[str, Any]:
    """What a row records of the steps a search took from the store: their number
    (``search_steps_reused``) and their summed cost when computed (``time_reused_s``,
    ``energy_kwh_reused``, ``co2_kg_reused``; None where any of them went unmeasured), which the
    compression cost adds to the job's own
    (:func:`~replaceme_exp.reporting.compression_cost.compression_cost`)."""

    def summed(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else float(sum(values))

    out: dict[str, Any] = {"search_steps_reused": len(costs)}
    if costs:
        out.update(
            time_reused_s=summed([c.seconds for c in costs]),
            energy_kwh_reused=summed([c.energy_kwh for c in costs]),
            co2_kg_reused=summed([c.co2_kg for c in costs]),
        )
    return out
