"""Which values of a table column are the best, and which are within noise of the best.

A table or report ranks nothing one measurement cannot separate. For each ranked column,
:func:`mark_column` finds the best cell (lowest perplexity, highest accuracy or speedup) and compares
every other cell with it (:func:`compare_cells`):

1. **Paired**, when both cells are one run each, scored on the same units: the same held-out windows
   (``ppl_heldout_windows_hash``; :func:`~replaceme_exp.intervals.paired_perplexity` on the
   log of their ratio, drawn by document where the row names each window's) or the same lm-eval items
   (``items_hash_<task>``;
   :func:`~replaceme_exp.intervals.paired_means`).
2. **Paired over calibration draws**, when both cells hold the same draws (seed, ``calibration_draw``),
   every run scored on the same units: a two-level bootstrap (draws and documents or items resampled)
   of the mean draw-by-draw difference.
3. **Unpaired** otherwise: the normal approximation on the two cells' standard errors (several seeds:
   their standard deviation over ``sqrt(n)``; one run: lm-eval's standard error, or the one its
   recorded 95% interval implies, on the log scale for a perplexity or a speedup).
4. **Not at all** when a cell has no uncertainty: it is neither marked best nor tied, and a column
   whose best cell has none is not ranked (compression time, CO2: one measurement each).

The best cell and every cell tied with it are the column's *leaders* (bold in the tables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from replaceme_exp.intervals import (
    LEVEL,
    Comparison,
    draws_means,
    draws_perplexity,
    paired_draws_means,
    paired_draws_perplexity,
    paired_means,
    paired_perplexity,
    simultaneous_means,
    simultaneous_perplexity,
    stderr_from_interval,
    unpaired,
)
from replaceme_exp.results.row import decode_cell
from replaceme_exp.row_format import PERPLEXITY_METRICS, decode_items, window_nll_of

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
    keys: the same units in the same order), the per-unit data and the clusters a bootstrap draws
    (windows: each window's document, or None; items: per task None or each item's cluster)."""

    kind: str
    key: tuple
    data: tuple
    clusters: object = None


def units_of(run: pd.Series, metric: str) -> Units | None:
    """The units behind ``run``'s ``metric``, when the row holds them (None: it does not)."""
    if metric in WINDOW_PERPLEXITIES:
        nll = window_nll_of(run.get(f"{metric}_window_nll"))
        tokens = decode_cell(run.get("ppl_heldout_window_tokens"))
        key = run.get("ppl_heldout_windows_hash")
        if nll is None or not isinstance(tokens, list) or not isinstance(key, str) or len(tokens) != len(nll):
            return None
        documents = decode_cell(run.get("ppl_heldout_window_documents"))
        documents = tuple(documents) if isinstance(documents, list) and len(documents) == len(nll) else None
        return Units("windows", (key, documents), (nll, np.asarray(tokens, dtype=np.float64)), documents)
    tasks = _accuracy_tasks(run, metric)
    if not tasks:
        return None
    items, keys, clusters = [], [], []
    for task in tasks:
        values, key = decode_items(run.get(f"score_items_{task}")), run.get(f"items_hash_{task}")
        if values is None or not isinstance(key, str):
            return None
        codes = decode_cell(run.get(f"item_clusters_{task}"))
        codes = list(codes) if isinstance(codes, list) and len(codes) == len(values) else None
        items.append(values)
        keys.append(f"{task}:{key}:{'clustered' if codes else 'items'}")
        clusters.append(codes)
    return Units("items", tuple(keys), tuple(items), clusters)


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


def _by_draw(runs: pd.DataFrame) -> dict | None:
    """A cell's runs by (seed, calibration draw); None when two share one (or the rows do not say)."""
    keys = [(run.get("seed"), run.get("calibration_draw", 0)) for _, run in runs.iterrows()]
    if len(set(keys)) != len(keys):
        return None
    return {key: run for key, (_, run) in zip(keys, runs.iterrows())}


def _draw_units(runs: list[pd.Series], metric: str) -> list[Units] | None:
    """The units of several runs of one setting (its draws), when all rest on the same ones."""
    found = [units_of(run, metric) for run in runs]
    if any(u is None for u in found) or len({(u.kind, u.key) for u in found}) != 1:
        return None
    if found[0].kind == "windows" and not all(np.array_equal(u.data[1], found[0].data[1]) for u in found):
        return None
    return found


def draws_interval(runs: pd.DataFrame, metric: str) -> tuple[float, float] | None:
    """The 95% interval of a cell's mean over its calibration draws (several runs of one setting): a
    two-level bootstrap over the draws and the documents or items they were all scored on; None when the
    runs do not rest on the same units."""
    units = _draw_units([run for _, run in runs.iterrows()], metric) if len(runs) > 1 else None
    if units is None:
        return None
    if units[0].kind == "windows":
        _, low, high = draws_perplexity(
            np.stack([u.data[0] for u in units]), units[0].data[1], clusters=units[0].clusters
        )
    else:
        _, low, high = draws_means([list(u.data) for u in units], clusters=units[0].clusters)
    return low, high


def compare_over_draws(a: Cell, b: Cell, metric: str, level: float = LEVEL) -> Comparison | None:
    """Two cells of several calibration draws each, on the same draws (seed, draw) and the same units: the
    mean over draws of their draw-by-draw paired difference, with a two-level bootstrap
    (:func:`~replaceme_exp.intervals.paired_draws_perplexity`,
    :func:`~replaceme_exp.intervals.paired_draws_means`); None otherwise."""
    by_a, by_b = _by_draw(a.runs), _by_draw(b.runs)
    if not by_a or not by_b or set(by_a) != set(by_b) or len(by_a) < 2:
        return None
    keys = sorted(by_a, key=str)
    units = _draw_units([by_a[k] for k in keys] + [by_b[k] for k in keys], metric)
    if units is None:
        return None
    ua, ub = units[: len(keys)], units[len(keys) :]
    if ua[0].kind == "windows":
        nll_a, nll_b = (np.stack([u.data[0] for u in side]) for side in (ua, ub))
        return paired_draws_perplexity(nll_a, nll_b, ua[0].data[1], level=level, clusters=ua[0].clusters)
    a_items, b_items = [list(u.data) for u in ua], [list(u.data) for u in ub]
    return paired_draws_means(a_items, b_items, level=level, clusters=ua[0].clusters)


def on_shared_draws(a: Cell, b: Cell, metric: str) -> tuple[Cell, Cell, int] | None:
    """``a`` and ``b`` cut to the (seed, calibration draw) pairs both have, where they have some but not
    the same (a search run on fewer draws than the setting it is compared with), and how many; None
    otherwise. Their comparison pairs those draws and no other."""
    by_a, by_b = _by_draw(a.runs), _by_draw(b.runs)
    if not by_a or not by_b or set(by_a) == set(by_b):
        return None
    keys = sorted(set(by_a) & set(by_b), key=str)
    if not keys:
        return None
    cells = []
    for by in (by_a, by_b):
        runs = pd.DataFrame([by[k] for k in keys])
        values = pd.to_numeric(runs[metric], errors="coerce")
        cells.append(Cell(float(values.mean()) if values.notna().all() else None, runs))
    return cells[0], cells[1], len(keys)


def compare_cells(a: Cell, b: Cell, metric: str, level: float = LEVEL) -> Comparison | None:
    """``a`` against ``b`` on ``metric`` (see the module docstring) with a ``level`` interval; None when
    they cannot be compared. Cells of other calibration draws that share some are compared on those
    (:func:`on_shared_draws`)."""
    if a.value is None or b.value is None:
        return None
    if (shared := on_shared_draws(a, b, metric)) is not None:
        a_shared, b_shared, n = shared
        found = compare_cells(a_shared, b_shared, metric, level)
        if found is None:
            return None
        return replace(found, method=f"{found.method}, on the {n} calibration draw(s) both have")
    if len(a.runs) > 1 or len(b.runs) > 1:
        if (over_draws := compare_over_draws(a, b, metric, level)) is not None:
            return over_draws
    if len(a.runs) == 1 and len(b.runs) == 1:
        ua, ub = units_of(a.runs.iloc[0], metric), units_of(b.runs.iloc[0], metric)
        if ua is not None and ub is not None and ua.kind == ub.kind and ua.key == ub.key:
            if ua.kind == "windows" and np.array_equal(ua.data[1], ub.data[1]):
                return paired_perplexity(ua.data[0], ub.data[0], ua.data[1], level=level, clusters=ua.clusters)
            if ua.kind == "items" and all(x.shape == y.shape for x, y in zip(ua.data, ub.data)):
                return paired_means(list(ua.data), list(ub.data), level=level, clusters=ua.clusters)
    se_a, se_b = a.stderr(metric), b.stderr(metric)
    if se_a is None or se_b is None:
        return None
    if on_log_scale(metric):
        if a.value <= 0 or b.value <= 0:
            return None
        return unpaired(math.log(a.value), se_a, math.log(b.value), se_b, level)
    return unpaired(a.value, se_a, b.value, se_b, level)


def compare_family(runs: list[pd.Series], reference: pd.Series, metric: str) -> list[Comparison] | None:
    """Each of ``runs`` against ``reference`` on ``metric`` with intervals that hold for all of them at
    once (max-T over the same resamples: :func:`~replaceme_exp.intervals.simultaneous_perplexity`,
    :func:`~replaceme_exp.intervals.simultaneous_means`), for a claim that picks the best of
    them. None unless every run was scored on the reference's units."""
    ref = units_of(reference, metric)
    found = [units_of(run, metric) for run in runs]
    if ref is None or not runs or any(u is None or u.kind != ref.kind or u.key != ref.key for u in found):
        return None
    if ref.kind == "windows":
        if not all(np.array_equal(u.data[1], ref.data[1]) for u in found):
            return None
        return simultaneous_perplexity([u.data[0] for u in found], ref.data[0], ref.data[1], clusters=ref.clusters)
    if not all(all(x.shape == y.shape for x, y in zip(u.data, ref.data)) for u in found):
        return None
    return simultaneous_means([list(u.data) for u in found], list(ref.data), clusters=ref.clusters)


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
    "difference contains 0: a paired bootstrap over the same held-out documents or lm-eval items, drawn by "
    "cluster where they share one, else "
    "the normal approximation on both standard errors); a column without uncertainty (one measurement "
    "each) is not ranked."
)
