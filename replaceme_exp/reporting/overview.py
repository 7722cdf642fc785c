"""One sweep's overview figures: the swept settings as axes, the unpruned model as a line, standard
errors as bars.

:func:`sweep_axes` picks the axes from the runs alone: the setting columns that vary among them,
minus those that are a function of axes already chosen (a derived column: ``solver`` follows
``objective``, ``regularizer`` follows ``alpha``, ``method`` and ``objective`` are one partition,
whatever the sweep typed), taken in :data:`AXIS_PRIORITY` order; the seed is never an axis (its runs
are replicates, averaged). Explicit ``cuts`` are an axis (categorical, labelled ``[a,b)``); selected
cuts are a result, never one.

:func:`figure_panels` turns the runs into what is drawn (:class:`Panel`: one point per combination of
the axes' values, its mean over seeds, its standard error, the baseline): tests read these, the PNG is
drawn from them by :func:`draw`. A numeric axis is drawn as lines with markers, a categorical one as
grouped bars; the first numeric axis is x, the next axis the series (colours), the third the panels.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from replaceme_exp.intervals import z_value
from replaceme_exp.reporting.cells import SETTING_COLUMNS
from replaceme_exp.reporting.paper_settings import baseline_columns
from replaceme_exp.reporting.precision import format_number
from replaceme_exp.results.row import decode_cell, format_cuts

# Axes first in this order (the name a reader knows: the method rather than the objective behind it);
# then the other setting columns.
AXIS_PRIORITY = (
    "method",
    "n_prune",
    "num_lts",
    "alpha",
    "cuts",
    "calibration",
    "n_calib_samples",
    "calib_seq_len",
    "mask_ratio",
    "structure",
    "lt_placement",
    "healing",
    "eval_max_windows",
    "eval_seq_len",
    "eval",
    "model",
    "dtype",
    "objective",
    "selection_metric",
    "solver",
    "protocol",
)
NOT_AXES = ("seed", "calibration_draw", "calibration_sample_seed", "model_fingerprint", "setting_hash", "config_hash")
AXIS_CANDIDATES = tuple(dict.fromkeys(AXIS_PRIORITY + ("job", "evaluated_checkpoint") + SETTING_COLUMNS))
AXIS_LABELS = {
    "method": "method",
    "n_prune": "blocks pruned (n_prune)",
    "num_lts": "linear transforms (num_lts)",
    "cuts": "cut [start, end)",
    "n_calib_samples": "calibration samples",
    "calib_seq_len": "calibration tokens per sample",
    "eval_max_windows": "held-out windows (eval.max_windows)",
    "eval_seq_len": "tokens per held-out window (eval.seq_len)",
}
METRIC_LABELS = {
    "ppl_heldout": "held-out perplexity (lower is better)",
    "avg_acc": "average accuracy",
    "cos_dist_after": "cosine distance across the cut, after T",
}
SELECTED = "selected"


def _plain(value):
    value = decode_cell(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _key(value) -> str:
    return json.dumps(_plain(value), default=str, sort_keys=True)


def axis_values(frame: pd.DataFrame, axis: str) -> pd.Series:
    """The values of ``axis`` per run, as plotted: plain values; ``cuts`` as ``[a,b)`` text for
    given cuts and ``selected`` for selected ones."""
    if axis == "cuts":
        explicit = frame["selection_metric"].isna() if "selection_metric" in frame.columns else True
        text = frame["cuts"].map(lambda v: format_cuts(v, SELECTED))
        return text.where(explicit, SELECTED)
    return frame[axis].map(_plain)


def _candidates(frame: pd.DataFrame) -> list[str]:
    out = [c for c in AXIS_CANDIDATES if c in frame.columns and c not in NOT_AXES and c != "cuts"]
    explicit_cuts = "cuts" in frame.columns and (
        "selection_metric" not in frame.columns or frame["selection_metric"].isna().any()
    )
    if explicit_cuts:
        out.insert(AXIS_PRIORITY.index("cuts"), "cuts")
    return out


def _is_function_of(keys: pd.DataFrame, column: str, axes: list[str]) -> bool:
    """Whether each combination of ``axes``' values among the runs (``keys``: their values as text)
    has one value of ``column``."""
    if not axes:
        return keys[column].nunique() <= 1
    return bool((keys.groupby(axes)[column].nunique() <= 1).all())


def sweep_axes(frame: pd.DataFrame) -> list[str]:
    """The swept settings of ``frame``'s runs, one per independent direction (see the module
    docstring), in :data:`AXIS_PRIORITY` order."""
    if frame.empty:
        return []
    keys = pd.DataFrame({c: axis_values(frame, c).map(_key) for c in _candidates(frame)}, index=frame.index)
    axes: list[str] = []
    for column in keys.columns:
        if not _is_function_of(keys, column, axes):
            axes.append(column)
    return axes


def is_numeric(values: pd.Series) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)


def value_label(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def axis_label(axis: str) -> str:
    return AXIS_LABELS.get(axis, axis)


def metric_label(metric: str) -> str:
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    return metric.removeprefix("score_")


# ---- standard errors --------------------------------------------------------------------------


def stderr_column(metric: str) -> str | None:
    """The column lm-eval's standard error of ``metric`` is recorded in (row_format.stderr_column):
    ``acc_piqa`` -> ``acc_stderr_piqa``, ``score_piqa`` -> ``score_stderr_piqa``, ``ppl_lambada`` ->
    ``ppl_stderr_lambada``; None for a metric without one."""
    for stem in ("acc_norm", "acc", "score", "ppl"):
        if metric.startswith(stem + "_") and not metric.startswith(stem + "_stderr_"):
            return f"{stem}_stderr_{metric[len(stem) + 1 :]}"
    return None


def _task_scores(run: pd.Series) -> list[str]:
    """The ``score_<task>`` columns ``avg_acc`` averages: the suite's tasks whose declared metric is
    not a perplexity (``eval_metrics``)."""
    metrics = decode_cell(run.get("eval_metrics"))
    if not isinstance(metrics, dict):
        return []
    return [f"score_{task}" for task, metric in metrics.items() if not str(metric).startswith(("perplexity", "word_"))]


def stderrs(frame: pd.DataFrame, metric: str, prefix: str = "") -> pd.Series:
    """Per run, the standard error of ``prefix + metric`` (``prefix``: ``baseline_``): lm-eval's
    recorded one; where the row records a 95% interval instead (``<metric>_ci_low`` / ``_ci_high``: the
    held-out perplexity, ``avg_acc``), the one it implies, ``(high - low) / 3.92``; for an older
    ``avg_acc`` without one (a mean of k task scores) ``sqrt(sum se_i^2) / k`` over the tasks it
    averages, where each has one; NaN where there is none."""
    column = stderr_column(metric)
    if column is not None and prefix + column in frame.columns:
        return pd.to_numeric(frame[prefix + column], errors="coerce")
    names = [prefix + metric] + ([f"{metric}_baseline"] if prefix == "baseline_" else [])  # ppl_heldout_baseline
    for named in names:
        if f"{named}_ci_low" in frame.columns and f"{named}_ci_high" in frame.columns:
            # a recorded 95% interval (a bootstrap over windows or items) as the standard error it implies
            high = pd.to_numeric(frame[f"{named}_ci_high"], errors="coerce")
            return (high - pd.to_numeric(frame[f"{named}_ci_low"], errors="coerce")) / (2 * z_value())
    if metric == "avg_acc":

        def combined(run: pd.Series) -> float:
            tasks = _task_scores(run)
            errors = [run.get(prefix + stderr_column(t)) for t in tasks]
            errors = [float(e) for e in errors if isinstance(e, (int, float)) and math.isfinite(e)]
            if not tasks or len(errors) != len(tasks):
                return math.nan
            return math.sqrt(sum(e * e for e in errors)) / len(tasks)

        return frame.apply(combined, axis=1).astype(float) if len(frame) else pd.Series(dtype=float)
    return pd.Series(math.nan, index=frame.index)


def baselines(frame: pd.DataFrame, metric: str) -> pd.Series:
    """Per run, the unpruned model's ``metric`` (``baseline_<metric>`` or an older alias); NaN without."""
    for column in baseline_columns(metric):
        if column in frame.columns:
            return pd.to_numeric(frame[column], errors="coerce")
    return pd.Series(math.nan, index=frame.index)


# ---- what is drawn ----------------------------------------------------------------------------


@dataclass
class Panel:
    """One plot: ``points`` (columns ``x``, ``series``, ``y`` the mean over the runs of a point,
    ``yerr`` its standard error, ``n`` its runs, ``error`` what the error is), the unpruned
    ``baseline`` (columns ``x``, ``y``, ``yerr``: one row with ``x`` None when one value holds for the
    whole panel), and how x is drawn."""

    title: str
    ylabel: str
    xlabel: str
    numeric_x: bool
    x_order: list
    series_label: str | None
    points: pd.DataFrame
    baseline: pd.DataFrame = field(default_factory=pd.DataFrame)
    series_order: list = field(default_factory=list)  # every series of the figure: one colour each
    metric: str = ""

    @property
    def log_y(self) -> bool:
        values = pd.concat([self.points["y"], self.baseline.get("y", pd.Series(dtype=float))]).dropna()
        return bool(len(values)) and values.min() > 0 and values.max() / values.min() > 20


def _combined(frame: pd.DataFrame, axes: list[str], named: bool = False) -> pd.Series:
    """Per run, its values of ``axes`` as one label (``alpha=0, n_prune=2``; one unnamed value for a
    single axis unless ``named``: a legend's title names it)."""
    if not axes:
        return pd.Series(None, index=frame.index, dtype=object)
    if len(axes) == 1 and not named:
        return axis_values(frame, axes[0]).map(value_label)
    parts = [axis_values(frame, a).map(lambda v, a=a: f"{a}={value_label(v)}") for a in axes]
    return pd.concat(parts, axis=1).apply(", ".join, axis=1)


def roles(frame: pd.DataFrame, axes: list[str]) -> tuple[str | None, list[str], list[str]]:
    """(x axis, series axes, panel axes): x the first numeric axis, else the first; the next axis is
    the series, the one after it the panels; any further axis joins the series."""
    if not axes:
        return None, [], []
    numeric = [a for a in axes if a != "cuts" and is_numeric(list(axis_values(frame, a)))]
    x = numeric[0] if numeric else axes[0]
    rest = [a for a in axes if a != x]
    series, panels = rest[:1], rest[1:2]
    return x, series + rest[2:], panels


def _order(values: list, numeric: bool) -> list:
    unique = list(dict.fromkeys(values))
    if numeric:
        return sorted(unique, key=lambda v: (v is None, v if v is not None else 0))

    def key(value) -> tuple:
        text = str(value)
        if text.startswith("["):  # cuts: by their blocks, [2,4) before [12,20)
            return (1, [int(n) for n in re.findall(r"\d+", text)], "")
        return (2 if value == SELECTED else 0, [], text)

    return sorted(unique, key=key)


def _point(group: pd.DataFrame) -> dict:
    """One point of a panel (a row of :attr:`Panel.points`) from the runs of one x and series."""
    n = len(group)
    if n > 1:  # replicates (seeds): the standard error of their mean
        yerr, error = float(group["y"].std(ddof=1) / math.sqrt(n)), "between runs"
    else:
        yerr, error = float(group["se"].iloc[0]), "recorded"
    series = group["series"].iloc[0]
    return {
        "x": group["x"].iloc[0],
        "series": series if isinstance(series, str) else None,
        "y": float(group["y"].mean()),
        "yerr": yerr,
        "n": n,
        "error": error if math.isfinite(yerr) else None,
    }


def _baseline(rows: pd.DataFrame) -> pd.DataFrame:
    """The unpruned model's value in a panel of ``rows`` (:attr:`Panel.baseline`)."""
    base = rows.dropna(subset=["base"])
    if base.empty:
        return pd.DataFrame(columns=["x", "y", "yerr"])
    if base["base"].round(12).nunique() == 1:
        first = base.iloc[0]
        return pd.DataFrame([{"x": None, "y": float(first["base"]), "yerr": float(first["base_se"])}])
    # the unpruned model's value moves with the x setting (e.g. eval.max_windows)
    firsts = base.groupby(base["x"].map(_key), sort=False).first()
    return pd.DataFrame({"x": list(firsts["x"]), "y": list(firsts["base"]), "yerr": list(firsts["base_se"])})


def metric_panels(
    frame: pd.DataFrame, metric: str, axes: list[str], title: str | None = None, split: bool = True
) -> list[Panel]:
    """The panels of one metric over ``frame``'s runs: one per value of the panel axis (``split``;
    else that axis joins the series)."""
    y = pd.to_numeric(frame[metric], errors="coerce") if metric in frame.columns else None
    if y is None or y.isna().all():
        return []
    x_axis, series_axes, panel_axes = roles(frame, axes)
    if not split:
        series_axes, panel_axes = series_axes + panel_axes, []
    data = pd.DataFrame(
        {
            "x": axis_values(frame, x_axis) if x_axis else None,
            "series": _combined(frame, series_axes),
            "panel": _combined(frame, panel_axes, named=True),
            "y": y,
            "se": stderrs(frame, metric),
            "base": baselines(frame, metric),
            "base_se": stderrs(frame, metric, "baseline_"),
        },
        index=frame.index,
    )
    data = data[data["y"].notna()]
    numeric_x = x_axis is not None and x_axis != "cuts" and is_numeric(list(data["x"]))
    all_series = _order([s for s in data["series"] if isinstance(s, str)], False)
    out = []
    for _, rows in data.groupby(data["panel"].map(_key), sort=True):
        groups = rows.groupby([rows["x"].map(_key), rows["series"].map(_key)], sort=False)
        points = pd.DataFrame([_point(group) for _, group in groups])
        name = rows["panel"].iloc[0] if isinstance(rows["panel"].iloc[0], str) else None
        out.append(
            Panel(
                title=" — ".join(t for t in (title or metric_label(metric), name) if t),
                ylabel=metric_label(metric) if split else "score",
                xlabel=axis_label(x_axis) if x_axis else "",
                numeric_x=numeric_x,
                x_order=_order(list(points["x"]), numeric_x),
                series_label=", ".join(axis_label(a) for a in series_axes) or None,
                points=points,
                baseline=_baseline(rows),
                series_order=all_series,
                metric=metric,
            )
        )
    return out


# ---- drawing ----------------------------------------------------------------------------------


def _pyplot():
    """matplotlib's pyplot (Agg backend), imported when the first figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


BASELINE_STYLE = {"color": "0.25", "linestyle": "--", "linewidth": 1.2}


def _draw_panel(ax, panel: Panel) -> None:
    series = [s for s in panel.series_order if s in set(panel.points["series"])] or [None]
    positions = {_key(x): i for i, x in enumerate(panel.x_order)}
    colors = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(len(series), 1)
    for i, name in enumerate(series):
        color = colors[panel.series_order.index(name) % len(colors)] if name in panel.series_order else colors[0]
        points = panel.points[panel.points["series"].map(_key) == _key(name)]
        points = points.assign(_pos=points["x"].map(lambda v: positions[_key(v)])).sort_values("_pos")
        yerr = points["yerr"].where(points["yerr"].map(lambda e: isinstance(e, float) and math.isfinite(e)))
        label = value_label(name) if name is not None else None
        if panel.numeric_x:
            ax.errorbar(points["x"], points["y"], yerr=yerr, marker="o", capsize=3, label=label, color=color)
        else:
            offset = (i - (len(series) - 1) / 2) * width
            ax.bar(points["_pos"] + offset, points["y"], width * 0.9, yerr=yerr, capsize=3, label=label, color=color)
    base = panel.baseline
    if not base.empty:
        first = base.iloc[0]
        text = "unpruned"
        if first["x"] is None:
            ax.axhline(first["y"], label=text, **BASELINE_STYLE)
            ax.annotate(
                format_number(first["y"]), (1, first["y"]), xycoords=("axes fraction", "data"), xytext=(-2, 2),
                textcoords="offset points", ha="right", va="bottom", fontsize="small", color=BASELINE_STYLE["color"],
            )  # fmt: skip
        elif panel.numeric_x:
            ordered = base.sort_values("x")
            ax.plot(ordered["x"], ordered["y"], marker="_", markersize=14, label=text, **BASELINE_STYLE)
        else:
            for k, row in enumerate(base.itertuples()):
                pos = positions.get(_key(row.x))
                if pos is not None:
                    ax.hlines(row.y, pos - 0.45, pos + 0.45, label=text if k == 0 else None, **BASELINE_STYLE)
    if not panel.numeric_x:
        labels = [value_label(x) for x in panel.x_order]
        long = sum(map(len, labels)) > 36  # would run into each other: slanted
        ax.set_xticks(range(len(labels)), labels, rotation=20 if long else 0, ha="right" if long else "center")
    elif len(panel.x_order) <= 8:
        ax.set_xticks(panel.x_order)
    if panel.numeric_x and _spans_decades(panel.x_order):
        positive = [x for x in panel.x_order if x and x > 0]
        ax.set_xscale("symlog", linthresh=min(positive)) if 0 in panel.x_order else ax.set_xscale("log")
    if panel.log_y:
        ax.set_yscale("log")
    ax.set_title(panel.title, fontsize="medium")
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3, axis="y" if not panel.numeric_x else "both")


def _spans_decades(values: list) -> bool:
    positive = [float(v) for v in values if v is not None and v > 0]
    return len(positive) >= 2 and max(positive) / min(positive) >= 100


def draw(panels: list[Panel], path: Path, note: str = "") -> object:
    """Draw ``panels`` side by side (up to 4 a row) into ``path`` (PNG); ``note`` under them.
    Returns the figure (closed: its artists stay readable)."""
    plt = _pyplot()
    columns = min(len(panels), 4)
    rows = math.ceil(len(panels) / columns)
    share = len({p.metric for p in panels}) == 1  # one metric's panels: one scale
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.6 * rows), squeeze=False, sharey=share)
    for ax, panel in zip(axes.flat, panels):
        _draw_panel(ax, panel)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    legend: dict = {}  # one legend for the figure: the series have one colour in every panel
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if len(legend) > 1 or (legend and panels[0].series_label):
        title = panels[0].series_label
        fig.legend(legend.values(), legend.keys(), title=title, loc="upper left", bbox_to_anchor=(1.0, 0.95))
    if note:
        fig.tight_layout(rect=(0, 0.05 if rows == 1 else 0.03, 1, 1))
        fig.text(0.5, 0.01, note, ha="center", va="bottom", fontsize="small", color="dimgray", wrap=True)
    else:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return fig
