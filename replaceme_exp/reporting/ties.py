"""Which values of a table column are the best, and which are within noise of the best.

A table or report ranks nothing one measurement cannot separate. For each ranked column,
:func:`mark_column` finds the best cell (lowest perplexity, highest accuracy or speedup) and compares
every other cell with it (:func:`compare_cells`):

1. **Paired**, when both cells are one run each, scored on the same units: the same held-out windows
   (``ppl_heldout_windows_hash``; :func:`~replaceme_exp.evaluation.intervals.paired_perplexity` on the
   log of their ratio) or the same lm-eval items (``items_hash_<task>``;
   :func:`~replaceme_exp.evaluation.intervals.paired_means`).
2. **Unpaired** otherwise: the normal approximation on the two cells' standard errors (several seeds:
   their standard deviation over ``sqrt(n)``; one run: lm-eval's standard error, or the one its
   recorded 95% interval implies, on the log scale for a perplexity or a speedup).
3. **Not at all** when a cell has no uncertainty: it is neither marked best nor tied, and a column
   whose best cell has none is not ranked (compression time, CO2: one measurement each).

The best cell and every cell tied with it are the column's *leaders* (bold in the tables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaceme_exp.evaluation.harness import PERPLEXITY_METRICS, decode_items
from replaceme_exp.evaluation.intervals import (
    Comparison,
    paired_means,
    paired_perplexity,
    stderr_from_interval,
    unpaired,
)
from replaceme_exp.evaluation.perplexity import window_nll_of
from replaceme_exp.results.row import decode_cell

# Columns whose best value is the highest; every other ranked column's is the lowest.
HIGHER_IS_BETTER_PREFIXES = ("avg_acc", "rp", "score_", "acc_", "acc_norm_", "exact_match_", "acc1_", "acc5_")
HIGHER_IS_BETTER_SUFFIXES = ("_speedup",)
# Perplexity columns held window by window: (value column, its per-window NLL column).
WINDOW_PERPLEXITIES = ("ppl_heldout", "ppl_heldout_baseline", "ppl_heldout_before_healing")
LEADER, TIED = "best", "tie"


def higher_is_better(metric: str) -> bool:
    return metric.startswith(HIGHER_IS_BETTER_PREFIXES) or metric.endswith(HIGHER_IS_BETTER_SUFFIXES)


def on_log_scale(metric: str) -> bool:
    """Ratios and perplexities are compared as logs (their intervals are not symmetric)."""
    return metric.startswith("ppl") or metric.endswith("_speedup")


def _number(value) -> float | None:
    value = decode_cell(value)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        value = float(value)
        return value if math.isfinite(value) else None
    return None


def _accuracy_tasks(run: pd.Series, metric: str) -> list[str] | None:
    """The tasks whose items ``metric`` of ``run`` averages: all accuracy tasks of the suite for
    ``avg_acc`` / ``rp``; the one task for its declared score (``score_<task>``, ``<metric>_<task>``)."""
    declared = decode_cell(run.get("eval_metrics"))
    if not isinstance(declared, dict):
        return None
    if metric in ("avg_acc", "rp"):
        return [t for t, m in declared.items() if m not in PERPLEXITY_METRICS] or None
    for task, task_metric in declared.items():
        if metric in (f"score_{task}", f"{task_metric}_{task}") and task_metric not in PERPLEXITY_METRICS:
            return [task]
    return None


@dataclass(frozen=True)
class Units:
    """What one run's value of a metric rests on: ``kind`` (``windows`` or ``items``), ``key`` (equal
    keys: the same units in the same order) and the per-unit data."""

    kind: str
    key: tuple
    data: tuple


def units_of(run: pd.Series, metric: str) -> Units | None:
    """The units behind ``run``'s ``metric``, when the row holds them (None: it does not)."""
    if metric in WINDOW_PERPLEXITIES:
        nll = window_nll_of(run.get(f"{metric}_window_nll"))
        tokens = decode_cell(run.get("ppl_heldout_window_tokens"))
        key = run.get("ppl_heldout_windows_hash")
        if nll is None or not isinstance(tokens, list) or not isinstance(key, str) or len(tokens) != len(nll):
            return None
        return Units("windows", (key,), (nll, np.asarray(tokens, dtype=np.float64)))
    tasks = _accuracy_tasks(run, metric)
    if not tasks:
        return None
    items, keys = [], []
    for task in tasks:
        values, key = decode_items(run.get(f"score_items_{task}")), run.get(f"items_hash_{task}")
        if values is None or not isinstance(key, str):
            return None
        items.append(values)
        keys.append(f"{task}:{key}")
    return Units("items", tuple(keys), tuple(items))


def interval_of(run: pd.Series, metric: str) -> tuple[float | None, float | None]:
    """``run``'s recorded interval of ``metric``: ``<metric>_ci_low`` / ``_ci_high`` (a 95% bootstrap),
    or for a speedup ``<metric>_min`` / ``_max`` (the range of its per-round paired ratios); (None, None)."""
    for low, high in (("_ci_low", "_ci_high"), ("_min", "_max")):
        found = _number(run.get(f"{metric}{low}")), _number(run.get(f"{metric}{high}"))
        if None not in found:
            return found
    return None, None


def stderr_of(run: pd.Series, metric: str) -> float | None:
    """``run``'s standard error of ``metric`` (on the log scale for :func:`on_log_scale` metrics):
    lm-eval's, ``avg_acc_stderr``, or the one its recorded interval (:func:`interval_of`) implies as a
    95% interval; None when the row records none."""
    low, high = interval_of(run, metric)
    if low is not None and high is not None:
        if on_log_scale(metric):
            return stderr_from_interval(math.log(low), math.log(high)) if low > 0 and high > 0 else None
        return stderr_from_interval(low, high)
    for stem in ("acc_norm", "acc", "score", "exact_match"):
        if metric.startswith(stem + "_"):
            return _number(run.get(f"{stem}_stderr_{metric[len(stem) + 1 :]}"))
    if metric == "avg_acc":
        return _number(run.get("avg_acc_stderr"))
    if metric == "rp":
        se, base = _number(run.get("avg_acc_stderr")), _number(run.get("avg_acc_baseline"))
        return se / base if se is not None and base else None
    return None


@dataclass
class Cell:
    """One table cell: its shown value and the runs behind it (one run, or several seeds)."""

    value: float | None
    runs: pd.DataFrame

    def stderr(self, metric: str) -> float | None:
        """Several runs: their standard deviation over sqrt(n) (log scale where compared so); one run:
        its recorded standard error."""
        if len(self.runs) > 1:
            values = pd.to_numeric(self.runs[metric], errors="coerce").dropna()
            if on_log_scale(metric):
                values = np.log(values[values > 0])
            return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
        return stderr_of(self.runs.iloc[0], metric) if len(self.runs) == 1 else None


def compare_cells(a: Cell, b: Cell, metric: str) -> Comparison | None:
    """``a`` against ``b`` on ``metric`` (see the module docstring); None when they cannot be compared."""
    if a.value is None or b.value is None:
        return None
    if len(a.runs) == 1 and len(b.runs) == 1:
        ua, ub = units_of(a.runs.iloc[0], metric), units_of(b.runs.iloc[0], metric)
        if ua is not None and ub is not None and ua.kind == ub.kind and ua.key == ub.key:
            if ua.kind == "windows" and np.array_equal(ua.data[1], ub.data[1]):
                return paired_perplexity(ua.data[0], ub.data[0], ua.data[1])
            if ua.kind == "items" and all(x.shape == y.shape for x, y in zip(ua.data, ub.data)):
                return paired_means(list(ua.data), list(ub.data))
    se_a, se_b = a.stderr(metric), b.stderr(metric)
    if se_a is None or se_b is None:
        return None
    if on_log_scale(metric):
        if a.value <= 0 or b.value <= 0:
            return None
        return unpaired(math.log(a.value), se_a, math.log(b.value), se_b)
    return unpaired(a.value, se_a, b.value, se_b)


def mark_column(cells: dict, metric: str) -> dict:
    """``{key: "best" | "tie"}`` for the column's leaders among ``cells`` (``{key: Cell}``): the best
    value, and every cell whose comparison with it is a tie. Empty when the best cell cannot be
    compared with any other (no uncertainty) or there is nothing to rank."""
    present = {k: c for k, c in cells.items() if c.value is not None}
    if len(present) < 2:
        return {}
    sign = -1.0 if higher_is_better(metric) else 1.0
    best = min(present, key=lambda k: sign * present[k].value)
    marks, compared = {best: LEADER}, False
    for key, cell in present.items():
        if key == best:
            continue
        comparison = compare_cells(cell, present[best], metric)
        if comparison is None:
            continue
        compared = True
        if comparison.tie:
            marks[key] = TIED
    return marks if compared else {}


LEADERS_NOTE = (
    "Bold: the best value of a column and every value within noise of it (the 95% interval of the "
    "difference contains 0: a paired bootstrap over the same held-out windows or lm-eval items, else "
    "the normal approximation on both standard errors); a column without uncertainty (one measurement "
    "each) is not ranked."
)
