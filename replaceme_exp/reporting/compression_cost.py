"""What compressing a model cost a run: the time and CO2 of its compression stages (capture, which
holds the selection and a search; estimation; healing), without loading, evaluation and saving, and
whether the run paid them itself or found part of the work in a cache.

A greedy search's steps taken from the step store (:mod:`replaceme_exp.selection.search_steps`)
are the method's cost all the same: their cost as measured when they were computed
(``time_reused_s``, ``co2_kg_reused``) is added; where a reused step's cost went unmeasured, the
run's cost is missing, not understated.

Shared by the time/emissions figure (``paper_figures``) and the tables with a compression-time
column (``paper_tables``: :data:`COMPRESSION_TIME` and :data:`COMPRESSION_CO2`, derived per run).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

COMPRESSION_STAGES = ("capture", "estimate", "heal")  # what compressing a model costs (not load or eval)
# Cached stages that make a run's compression cost not its own (cached_stages, JSON list).
COST_CACHED_STAGES = ("selection", "statistics")
# The derived columns: summed time (s) and CO2 (kg) of the compression stages (co2_kg_*: an energy
# metric, marked "(est.)" where CodeCarbon estimated the power).
COMPRESSION_TIME = "time_compression_s"
COMPRESSION_CO2 = "co2_kg_compression"


def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index)
    return pd.to_numeric(frame[column], errors="coerce")


def compression_cost(frame: pd.DataFrame) -> pd.DataFrame:
    """Per run: ``time_s`` and ``co2_kg`` summed over the compression stages (capture,
    estimation, healing) and the reused search steps (module docstring), without loading and
    evaluation; NaN where a run recorded none, or reused steps whose cost is unknown. A run that
    took every step from the store ran no compression stage: its own share is 0 where the job
    measured anything at all (``time_total_s``, ``co2_kg``)."""
    reusing = _numeric(frame, "search_steps_reused").fillna(0) > 0

    def summed(template: str, reused: str, measured: str) -> pd.Series:
        stages = pd.concat([_numeric(frame, template.format(stage)) for stage in COMPRESSION_STAGES], axis=1)
        own, extra = stages.sum(axis=1, min_count=1), _numeric(frame, reused)
        own = own.mask(own.isna() & reusing & _numeric(frame, measured).notna(), 0.0)
        return (own + extra.fillna(0.0)).mask(reusing & extra.isna())

    return pd.DataFrame(
        {
            "time_s": summed("time_{}_s", "time_reused_s", "time_total_s"),
            "co2_kg": summed("co2_kg_{}", "co2_kg_reused", "co2_kg"),
        },
        index=frame.index,
    )


def cached_stages(value) -> list[str] | None:
    """A row's ``cached_stages`` as a list, None when unrecorded or unreadable."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return [str(v) for v in value]
    return None


def cost_cached(frame: pd.DataFrame) -> pd.Series:
    """Per run: whether its compression cost is not its own (``selection`` or ``statistics`` in
    ``cached_stages``); False where unrecorded."""
    column = frame["cached_stages"] if "cached_stages" in frame.columns else pd.Series(None, index=frame.index)
    stages = column.map(cached_stages)
    return stages.map(lambda s: s is not None and any(stage in s for stage in COST_CACHED_STAGES)).astype(bool)


def uncached_runs(frame: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """The runs whose compression stages were measured in the job, not served from a cache: no
    ``selection`` or ``statistics`` in ``cached_stages``. Runs without a ``cached_stages`` record
    (written before the column existed) are unknown and excluded too. Returns (runs, number
    excluded as cached, number excluded as unrecorded)."""
    if frame.empty:
        return frame, 0, 0
    column = frame["cached_stages"] if "cached_stages" in frame.columns else pd.Series(None, index=frame.index)
    unknown = column.map(cached_stages).isna()
    cached = cost_cached(frame)
    return frame[~unknown & ~cached], int(cached.sum()), int(unknown.sum())


def with_compression_cost(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with :data:`COMPRESSION_TIME` and :data:`COMPRESSION_CO2` (NaN where a run recorded
    no compression stage)."""
    cost = compression_cost(runs)
    return runs.copy().assign(**{COMPRESSION_TIME: cost["time_s"], COMPRESSION_CO2: cost["co2_kg"]})
