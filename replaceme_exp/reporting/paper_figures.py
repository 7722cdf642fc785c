"""The paper's figures from the results store: one PNG each, and a CSV of the plotted numbers
(written by ``make paper-tables``).

Every point is the mean of the finished runs behind it (error bars: standard deviation when
there are several); a panel with no run behind it says so instead of drawing anything. Like a
table cell, a point averages only runs identical except for the seed: where the runs behind it
hold several settings, one is shown (``selection.choose_setting``) and the CSV's ``note`` column
(and a line under the figure) names the settings left out.

Each figure draws the series paper.yaml's ``figures`` lists for it (a label, the conditions of its
runs, a style): the paper's methods, LS and cosine ReplaceMe and its identity baseline.

- ``calibration_size``: average accuracy and perplexity against the number of calibration
  samples (its series, the unpruned model dashed).
- ``pruned_layers``: average accuracy against the number of pruned blocks (1-7; Falcon 1-15), the
  paper's "ReplaceMe Adam" (the cosine objective) and the identity baseline, one panel per model
  (the paper's three, and Mistral 7B beyond the paper: its panel's title says so).
- ``time_emissions``: compression time and CO2 relative to the first series (LS), and RP, for
  its series, the baseline healed with LoRA (its healing counts as compression); uncached runs only (a
  run whose selection distances or LS statistics came from a cache did not pay for them; a run
  without a ``cached_stages`` record is excluded as unknown); the figure and its CSV say how many runs were excluded.
- ``block_selection``: every 8-block window's held-out cosine distance and L2 distance, and its
  linear CKA, mean CCA and PWCCA (over the calibration tokens when any window run recorded them,
  ``record_calibration_similarity=true``, runs without them then showing no point there; else
  held-out; a line under the figure when they came from fewer than 50 x d tokens) against the
  pruned model's average accuracy, per method, with a least-squares trend line; and the distances
  and accuracies over the window's position.
- ``layer_distances``: the mean cosine distance between the outputs of every pair of blocks.
- ``leaderboard``: scores on BBH, MATH, GPQA, MuSR and MMLU-Pro relative to the unpruned model,
  per series, one panel per model (Llama 2 7B and Llama 3 8B Instruct at 25%).

Each figure takes a :class:`paper_settings.Target` like the tables (``make paper-tables MODEL=
CALIBRATION= EVAL=``): its conditions are retargeted to another model, calibration set or suite,
a line under the figure says so, ``pruned_layers`` draws one panel for the target model and the
perplexity panel reads the target suite's perplexity. The frame a figure returns carries, in
``attrs["counts"]``, how many runs it found, matched and showed (:class:`paper_settings.Tally`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from replaceme_exp.reporting.artifacts import Sweep, register
from replaceme_exp.reporting.cells import choose_setting, matches
from replaceme_exp.reporting.compression_cost import compression_cost, uncached_runs
from replaceme_exp.reporting.energy_marks import NOTE as ESTIMATED_NOTE
from replaceme_exp.reporting.energy_marks import any_estimated, marked
from replaceme_exp.reporting.paper_records import check_keys, conditions, paper_records
from replaceme_exp.reporting.paper_settings import (
    DEFAULT_METHOD,
    LLAMA3_25,
    Retargeting,
    Tally,
    Target,
    baseline_columns,
    finished_runs,
    select_cell,
)
from replaceme_exp.reporting.paper_tables import METHODS_TABLES, table_named
from replaceme_exp.reporting.paths import file_name
from replaceme_exp.row_format import MIN_TOKENS_PER_DIM


def _pyplot():
    """matplotlib's pyplot (Agg backend), imported when the first figure is drawn: the tables, and
    whatever imports this module, do without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class Series:
    """One series of a figure (paper.yaml's ``figures``): its label, the conditions of its runs (over
    the figure's own) and its matplotlib style."""

    label: str
    conditions: dict
    style: dict


def series_of(figure: str) -> list[Series]:
    """The series ``figure`` draws, in their order in paper.yaml."""
    where = f"paper.yaml figures.{figure}"
    for s in paper_records()["figures"][figure]:
        check_keys(s, ("label", "conditions", "style"), f"{where} series")
    return [
        Series(s["label"], conditions(s.get("conditions"), where), dict(s.get("style") or {}))
        for s in paper_records()["figures"][figure]
    ]


# The pruned-layers figure's panels: the paper's (Llama 3 8B, Falcon 2 11B, Qwen 2.5 7B), and Mistral
# 7B, which its caption names ("Mistral 3 7B") but it does not draw.
PRUNED_LAYERS_MODELS = {
    "llama3_8b_instruct": "Llama 3 8B instruct",
    "mistral_7b_instruct_v03": "Mistral 7B instruct v0.3 (beyond the paper)",
    "falcon2_11b": "Falcon 2 11B",
    "qwen25_7b_instruct": "Qwen 2.5 7B instruct",
}
# Methods differ in their selection metric (a method's conditions name it).
METHOD_FREE = {k: v for k, v in DEFAULT_METHOD.items() if k != "selection_metric"}
# ... and in healing (time_emissions' baseline is healed with LoRA, ReplaceMe is not).
TIME_EMISSIONS_WHERE = {
    **{k: v for k, v in METHOD_FREE.items() if k != "healing"},
    **{"model": "llama2_7b", "n_prune": 8, "eval": "llama2_table"},
}
PLOTTED_COLUMNS = ["panel", "series", "x", "mean", "std", "n", "note"]


def select(runs: pd.DataFrame, conditions: dict) -> pd.DataFrame:
    if runs.empty:
        return runs
    finished = runs[runs["status"] == "finished"]
    return finished[matches(finished, conditions)]


def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index)
    return pd.to_numeric(frame[column], errors="coerce")


def mean_std(frame: pd.DataFrame, x: str, y: str, prefer: dict | None = None) -> pd.DataFrame:
    """Per value of ``x``: the runs of one setting there (:func:`selection.choose_setting`),
    their mean, std (0 for one run) and n of ``y``, a ``note`` naming the settings left out
    ("" when none) and the index of the ``runs`` averaged; sorted by ``x``."""
    xs = _numeric(frame, x)
    points = []
    for value in sorted(xs.dropna().unique()):
        choice = choose_setting(frame[xs == value], prefer)
        ys = _numeric(choice.shown, y).dropna()
        if ys.empty:
            continue
        std = float(ys.std(ddof=1)) if len(ys) > 1 else 0.0
        note = choice.note(f"{x}={value:g}") or ""
        runs = tuple(ys.index)
        points.append({"x": value, "mean": float(ys.mean()), "std": std, "n": len(ys), "note": note, "runs": runs})
    return pd.DataFrame(points, columns=["x", "mean", "std", "n", "note", "runs"])


def _no_runs(ax, what: str, prefix: str = "no runs") -> None:
    ax.text(0.5, 0.5, f"{prefix}: {what}", ha="center", va="center", transform=ax.transAxes, color="gray")


class Plotted:
    """What a figure shows, as rows (panel, series, x, mean, std, n, note): written beside the
    PNG as CSV so that every plotted number can be checked or replotted; ``note`` names the
    settings left out of a point (or what the figure excluded). It also reads the figure's runs
    (:meth:`runs`: retargeted to ``target``) and counts them (:class:`paper_settings.Tally`)."""

    def __init__(self, target: Target | None = None):
        self.rows: list[dict] = []
        self.retarget = Retargeting(target)
        self.tally = Tally()

    def runs(self, runs: pd.DataFrame, conditions: dict, keep=None, kept: str = "") -> pd.DataFrame:
        """The finished runs matching the paper's ``conditions`` retargeted (then ``keep``, see
        :meth:`paper_settings.Tally.cell`), counted as found and matched."""
        return self.tally.cell(finished_runs(runs, "text"), self.retarget.conditions(conditions), keep, kept)

    def select(self, runs: pd.DataFrame, conditions: dict) -> pd.DataFrame:
        """Like :meth:`runs`, not counted (for the unpruned model's values)."""
        return select_cell(finished_runs(runs, "text"), self.retarget.conditions(conditions))

    def add(self, panel: str, series: str, points: pd.DataFrame) -> None:
        for p in points.to_dict("records"):
            row = {k: p.get(k) for k in ("x", "mean", "std", "n")}
            self.rows.append({"panel": panel, "series": series, **row, "note": p.get("note") or ""})
            self.tally.shown |= set(p.get("runs") or ())

    def no_runs(self, ax, template: str, matched: int = 0, metric: str | None = None) -> None:
        """Say on ``ax`` that nothing was drawn: no runs (naming the sweep, with the target's
        overrides), or ``matched`` runs that record no ``metric``."""
        if matched and metric:
            _no_runs(ax, f"{matched} matching run(s) record no {metric}", "nothing to plot")
        else:
            _no_runs(ax, "\n".join(filter(None, [template, self.retarget.target.overrides()])))

    def notes(self) -> list[str]:
        return [r["note"] for r in self.rows if r["note"]]

    def frame(self, name: str = "figure") -> pd.DataFrame:
        frame = pd.DataFrame(self.rows, columns=PLOTTED_COLUMNS)
        frame.attrs["counts"] = self.tally.line(name, "a point")
        return frame

    def footnote(self, *lines: str | None) -> str | None:
        """``lines`` and the retargeting caption, as one line for under the figure (None: none)."""
        text = " ".join(filter(None, [*lines, self.retarget.caption()]))
        return text or None


def _settings_footnote(plotted: Plotted) -> str | None:
    """A line for under the figure when some point left runs of other settings out."""
    left_out = sum(1 for r in plotted.rows if "not shown" in r["note"])
    if not left_out:
        return None
    return f"{left_out} point(s) show one of several matching settings; the others: see the CSV's note column."


def _line(ax, points: pd.DataFrame, plotted: Plotted, panel: str, series: str, **style) -> bool:
    if points.empty:
        return False
    plotted.add(panel, series, points)
    ax.errorbar(points["x"], points["mean"], yerr=points["std"], capsize=3, marker="o", label=series, **style)
    return True


def _baseline(runs: pd.DataFrame, metric: str) -> float | None:
    for column in baseline_columns(metric):  # baseline_<metric>, then avg_acc_baseline / ppl_heldout_baseline
        values = _numeric(runs, column).dropna()
        if not values.empty:
            return float(values.iloc[-1])
    return None


def calibration_size(runs: pd.DataFrame, path: Path, target: Target | None = None) -> pd.DataFrame:
    plotted = Plotted(target)
    fig, axes = _pyplot().subplots(1, 2, figsize=(10, 3.6))
    where = {k: v for k, v in LLAMA3_25.items() if k != "n_calib_samples"}
    base = plotted.select(runs, where)
    model = plotted.retarget.target.model
    for ax, paper_metric in ((axes[0], "avg_acc"), (axes[1], "ppl_lambada")):
        metric, named = plotted.retarget.metric(paper_metric)  # the target suite's perplexity, named
        title = "Average accuracy" if metric == "avg_acc" else f"Perplexity ({metric})" if named else "Perplexity"
        drawn, matched = False, 0
        for series in series_of("calibration_size"):
            selected = plotted.runs(runs, {**where, **series.conditions})
            matched += len(selected)
            points = mean_std(selected, "n_calib_samples", metric)
            drawn |= _line(ax, points, plotted, metric, series.label, **series.style)
        if (value := _baseline(base, metric)) is not None:
            plotted.add(metric, "baseline", pd.DataFrame([{"x": np.nan, "mean": value, "std": 0.0, "n": 1}]))
            ax.axhline(value, color="orange", linestyle="--", label=f"{model or 'Llama3 8B'} (baseline)")
        if not drawn:
            plotted.no_runs(ax, "+paper=calibration_size", matched, metric)
        ax.set(title=f"{title} vs. calibration samples", xlabel="Calibration samples", ylabel=named or title)
        ax.grid(alpha=0.3)
    _legend(*axes)
    _save(fig, path, plotted.footnote(_settings_footnote(plotted)))
    return plotted.frame("calibration_size")


def pruned_layers(runs: pd.DataFrame, path: Path, target: Target | None = None) -> pd.DataFrame:
    """One panel per paper model, or with a target model one panel for it."""
    plotted = Plotted(target)
    model = plotted.retarget.target.model
    panels = {m: (title, [m]) for m, title in PRUNED_LAYERS_MODELS.items()}
    if model is not None:
        panels = {model: (model, list(PRUNED_LAYERS_MODELS))}
    width = 4 * len(panels) if len(panels) > 1 else 5
    fig, axes = _pyplot().subplots(1, len(panels), figsize=(width, 3.6), sharey=True, squeeze=False)
    for ax, (panel, (title, paper_models)) in zip(axes[0], panels.items()):
        where = {**METHOD_FREE, "model": paper_models[0], "eval": "paper"}
        for other in paper_models[1:]:  # the caption names every paper model this panel stands for
            plotted.retarget.conditions({**where, "model": other})
        drawn, matched = False, 0
        for series in series_of("pruned_layers"):
            selected = plotted.runs(runs, {**where, **series.conditions})
            matched += len(selected)
            drawn |= _line(ax, mean_std(selected, "n_prune", "avg_acc"), plotted, panel, series.label, **series.style)
        if not drawn:
            sweep = "+paper=pruned_layers_falcon" if panel == "falcon2_11b" else "+paper=pruned_layers"
            plotted.no_runs(ax, sweep, matched, "avg_acc")
        ax.set(title=title, xlabel="Pruned blocks", ylabel="Average accuracy")
        ax.grid(alpha=0.3)
    _legend(*axes[0])
    _save(fig, path, plotted.footnote(_settings_footnote(plotted)))
    return plotted.frame("pruned_layers")


def time_emissions(runs: pd.DataFrame, path: Path, target: Target | None = None) -> pd.DataFrame:
    """Uncached runs only (:func:`uncached_runs`); per method, one setting of its runs
    (:func:`selection.choose_setting`)."""
    plotted = Plotted(target)
    methods = {series.label: series.conditions for series in series_of("time_emissions")}
    first = next(iter(methods))  # the reference the costs are relative to
    _, n_cached, n_unknown = uncached_runs(plotted.select(runs, TIME_EMISSIONS_WHERE))
    excluded = (
        f"uncached runs only: excluded {n_cached} with cached selection/statistics, "
        f"{n_unknown} without a cached_stages record"
    )
    stats, estimated = _uncached_costs(runs, methods, plotted)
    fig, (left, right) = _pyplot().subplots(1, 2, figsize=(10, 3.6))
    _relative_costs(left, stats, first, estimated, plotted)
    with_rp = {k: v["rp"] for k, v in stats.items() if not np.isnan(v["rp"])}
    for label, value in with_rp.items():
        point = {"x": np.nan, "mean": value, "std": 0.0, "n": stats[label]["n"], "note": stats[label]["note"]}
        plotted.add("rp", label, pd.DataFrame([point]))
    if with_rp:
        bars = right.bar(list(with_rp), [100 * v for v in with_rp.values()], color="tab:green")
        right.bar_label(bars, fmt="%.1f", fontsize="x-small")
    else:
        plotted.no_runs(right, "+paper=time_emissions", sum(s["n"] for s in stats.values()), "rp")
    right.set(title="Relative accuracy (uncached runs only)", ylabel="RP (%)")
    for series, count in (("cached", n_cached), ("unrecorded", n_unknown)):
        point = {"x": np.nan, "mean": np.nan, "std": np.nan, "n": count, "note": excluded}
        plotted.add("excluded", series, pd.DataFrame([point]))
    footnote = excluded[0].upper() + excluded[1:] + "." + (f" {ESTIMATED_NOTE}" if estimated else "")
    _save(fig, path, plotted.footnote(footnote, _settings_footnote(plotted)))
    return plotted.frame("time_emissions")


def _uncached_costs(runs: pd.DataFrame, methods: dict[str, dict], plotted: Plotted) -> tuple[dict[str, dict], bool]:
    """Per series label, over one setting of its uncached runs: mean ``co2`` (kg), ``time`` (s) and
    ``rp``, the run count ``n`` and the ``note`` on settings left out; and whether any energy was
    estimated."""
    stats, estimated = {}, False
    for label, method in methods.items():
        choice = choose_setting(uncached_runs(plotted.runs(runs, {**TIME_EMISSIONS_WHERE, **method}))[0])
        plotted.tally.show(choice.shown)
        if choice.shown is not None:
            chosen = choice.shown
            estimated = estimated or any_estimated(chosen)
            cost = compression_cost(chosen)
            note = "; ".join(filter(None, ["uncached runs only", choice.note(label)]))
            stats[label] = {
                "co2": cost["co2_kg"].mean(),
                "time": cost["time_s"].mean(),
                "rp": _numeric(chosen, "rp").mean(),
                "n": len(chosen),
                "note": note,
            }
    return stats, estimated


def _relative_costs(ax, stats: dict[str, dict], first: str, estimated: bool, plotted: Plotted) -> None:
    """Bars of each series' emissions and time over the ``first`` series' (the reference)."""
    reference = stats.get(first)
    costs = {k: v for k, v in stats.items() if not np.isnan(v["time"])}
    if reference and reference["time"] > 0:
        width = 0.8 / len(costs)
        for i, (label, s) in enumerate(costs.items()):
            relative = [s["co2"] / reference["co2"] if reference["co2"] else np.nan, s["time"] / reference["time"]]
            for what, value in zip(("emissions_rel_ls", "time_rel_ls"), relative):
                point = {"x": np.nan, "mean": value, "std": 0.0, "n": s["n"], "note": s["note"]}
                plotted.add(what, label, pd.DataFrame([point]))
            bars = ax.bar(np.arange(2) + i * width, relative, width, label=label)
            ax.bar_label(bars, fmt="%.3g", fontsize="x-small")
        emissions = marked("Emissions", estimated)  # "Emissions (est.)": CodeCarbon estimated the power
        ax.set_xticks(np.arange(2) + width * (len(costs) - 1) / 2, [emissions, "Time"])
        _legend(ax)
    else:
        plotted.no_runs(ax, f"+paper=time_emissions ({first} is the reference)")
    ax.set(title="Compression cost relative to LS (uncached runs only)", ylabel="Rel. to LS")


ONE_WINDOW = "has one explicit cut (cuts=[[start, end]]: +paper=block_selection)"
WITH_MATRIX = "recorded layer_distances (record_layer_distances=true)"


def _one_window(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs with one explicit cut (a sliding window)."""
    if "cuts" not in frame.columns:
        return frame
    return frame[frame["cuts"].map(lambda c: isinstance(c, str) and len(json.loads(c)) == 1)]


def _window_start(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a ``window_start`` column: the start of its one explicit cut."""
    starts = frame["cuts"].map(lambda c: json.loads(c)[0][0]) if "cuts" in frame.columns else np.nan
    return frame.assign(window_start=starts)


BLOCK_SELECTION_DISTANCES = (("cos_dist_before", "Cosine distance"), ("l2_dist_before", "L2"))
BLOCK_SELECTION_SIMILARITIES = (("linear_cka", "Linear CKA"), ("mean_cca", "Mean CCA"), ("pwcca", "PWCCA"))
SIMILARITY_SOURCES = {"calibration": "calibration tokens", "before": "held-out"}


def _similarity_source(frames) -> str:
    """Where the figure's CKA / CCA / PWCCA come from: the calibration tokens when any run recorded
    them there (``record_calibration_similarity=true``), else the held-out windows (``before``)."""
    recorded = any(
        _numeric(f, f"{name}_calibration").notna().any() for f in frames for name, _ in BLOCK_SELECTION_SIMILARITIES
    )
    return "calibration" if recorded else "before"


def _undersampled_footnote(frames, source: str) -> str | None:
    """A line counting the window runs whose CCA / PWCCA came from too few tokens for their d."""
    column = f"similarity_undersampled_{source}"
    flagged = sum(int(f[column].eq(True).sum()) for f in frames if column in f.columns)
    if not flagged:
        return None
    where = SIMILARITY_SOURCES[source]
    hint = "" if source == "calibration" else "; record_calibration_similarity=true takes them over the calibration set"
    few = f"fewer than {MIN_TOKENS_PER_DIM} x d tokens"
    return f"{flagged} run(s)' mean CCA / PWCCA ({where}) come from {few}: biased upward{hint}."


def block_selection(runs: pd.DataFrame, path: Path, target: Target | None = None) -> pd.DataFrame:
    """Every one-window run: each similarity measure of its window (cosine and L2 on held-out data
    without T; linear CKA, mean CCA and PWCCA over the calibration tokens when any run recorded
    them, else held-out) against the pruned model's average accuracy, per method with a
    least-squares trend line; then, over the window's start, the bounded measures as distances
    (cosine, 1 - CKA, 1 - CCA, 1 - PWCCA, from the LS runs) and each method's accuracy."""
    plotted = Plotted(target)
    methods = {series.label: series.conditions for series in series_of("block_selection")}
    colors = {series.label: series.style["color"] for series in series_of("block_selection")}
    where = {**LLAMA3_25, "selection_metric": None}  # explicit cuts: the sliding windows
    windows = {
        name: _window_start(plotted.runs(runs, {**where, **method}, keep=_one_window, kept=ONE_WINDOW))
        for name, method in methods.items()
    }
    source = _similarity_source(windows.values())
    measures = [(column, label, "held-out, without T") for column, label in BLOCK_SELECTION_DISTANCES]
    measures += [
        (f"{name}_{source}", label, SIMILARITY_SOURCES[source]) for name, label in BLOCK_SELECTION_SIMILARITIES
    ]
    fig, axes = _pyplot().subplots(2, 4, figsize=(20, 7.2))
    scatter_axes = [axes[0, 0], axes[0, 1], axes[0, 2], axes[0, 3], axes[1, 0]]
    for ax, measure in zip(scatter_axes, measures):
        _accuracy_against(ax, measure, windows, colors, plotted)
    profile, accuracy = axes[1, 1], axes[1, 2]
    axes[1, 3].axis("off")
    _window_profiles(profile, accuracy, windows, colors, source, plotted)
    _legend(*scatter_axes)
    _legend(profile)
    _legend(accuracy)
    _save(fig, path, plotted.footnote(_undersampled_footnote(windows.values(), source), _settings_footnote(plotted)))
    return plotted.frame("block_selection")


def _accuracy_against(ax, measure: tuple[str, str, str], windows: dict, colors: dict, plotted: Plotted) -> None:
    """One scatter panel: each series' window runs, the window's ``measure`` (column, label, where it was
    measured) against the pruned model's average accuracy, with a least-squares trend line."""
    metric, label, data = measure
    drawn, matched = False, 0
    for name, frame in windows.items():
        matched += len(frame)
        points = mean_std(frame, metric, "avg_acc")
        if points.empty:
            continue
        drawn = True
        plotted.add(metric, name, points)
        ax.scatter(points["x"], points["mean"], color=colors[name], label=name, s=14)
        if len(points) >= 2:
            slope, intercept = np.polyfit(points["x"], points["mean"], 1)
            xs = np.linspace(points["x"].min(), points["x"].max(), 2)
            ax.plot(xs, slope * xs + intercept, color=colors[name], ls="--", lw=1)
    if not drawn:
        plotted.no_runs(ax, "+paper=block_selection", matched, f"{metric} and avg_acc")
    ax.set(title=f"{label} of the window vs. accuracy", xlabel=f"{label} ({data})")
    ax.set_ylabel("Average accuracy")
    ax.grid(alpha=0.3)


def _window_profiles(profile, accuracy, windows: dict, colors: dict, source: str, plotted: Plotted) -> None:
    """Over the window's first block: the first series' distances (cosine, 1 - each similarity) on
    ``profile``, and every series' accuracy on ``accuracy``."""
    ls_windows = windows[next(iter(windows))]  # the first series' (the LS runs)
    drawn = False
    profiles = [("cos_dist_before", "cosine distance", "black")]
    profiles += [
        (f"{name}_{source}", f"1 - {label}", color)
        for (name, label), color in zip(BLOCK_SELECTION_SIMILARITIES, ("purple", "orange", "brown"))
    ]
    for metric, label, color in profiles:
        points = mean_std(ls_windows, "window_start", metric)
        if metric != "cos_dist_before":
            points["mean"] = 1.0 - points["mean"]
        drawn |= _line(ax=profile, points=points, plotted=plotted, panel=f"profile_{metric}", series=label, color=color)
    if not drawn:
        plotted.no_runs(profile, "+paper=block_selection", len(ls_windows), "held-out distances")
    profile.set(title="Distance of each window (LS runs)", xlabel="First pruned block", ylabel="Distance")
    profile.grid(alpha=0.3)
    drawn = False
    for name, frame in windows.items():
        points = mean_std(frame, "window_start", "avg_acc")
        drawn |= _line(ax=accuracy, points=points, plotted=plotted, panel="accuracy", series=name, color=colors[name])
    if not drawn:
        plotted.no_runs(accuracy, "+paper=block_selection", sum(len(f) for f in windows.values()), "avg_acc")
    accuracy.set(title="Accuracy of each window", xlabel="First pruned block", ylabel="Average accuracy")
    accuracy.grid(alpha=0.3)


def _with_matrix(frame: pd.DataFrame) -> pd.DataFrame:
    if "layer_distances" not in frame.columns:
        return frame.iloc[0:0]
    return frame[frame["layer_distances"].notna()].sort_values("started_at")


def layer_distances(
    runs: pd.DataFrame, path: Path, model: str = "llama3_8b_instruct", target: Target | None = None
) -> pd.DataFrame:
    """The latest recorded matrix of ``model`` (the paper's figure), or of whichever model was
    recorded last when ``model`` has none; with a target model, of that model only."""
    plotted = Plotted(target)
    fig, ax = _pyplot().subplots(figsize=(6, 5))
    if plotted.retarget.target.model is not None:
        recorded = plotted.runs(runs, {"model": model}, keep=_with_matrix, kept=WITH_MATRIX)
        model = plotted.retarget.target.model
    else:
        recorded = plotted.runs(runs, {}, keep=_with_matrix, kept=WITH_MATRIX)
        if "model" in recorded.columns and (recorded["model"] == model).any():
            recorded = recorded[recorded["model"] == model]
    if recorded.empty:
        plotted.no_runs(ax, "+paper=layer_distances")
        title = model
    else:
        latest = recorded.iloc[-1]
        plotted.tally.show(recorded.iloc[-1:])
        title = latest["model"]
        value = latest["layer_distances"]
        matrix = np.array(json.loads(value) if isinstance(value, str) else value, dtype=float)
        for i, row in enumerate(matrix):
            plotted.add(f"row_{i}", title, pd.DataFrame({"x": np.arange(len(row)), "mean": row, "std": 0.0, "n": 1}))
        image = ax.imshow(matrix, cmap="viridis", origin="upper")
        fig.colorbar(image, ax=ax, label="mean cosine distance")
        ax.set(xlabel="block j", ylabel="block i")
    ax.set_title(f"Cosine distance between block outputs ({title})")
    _save(fig, path, plotted.footnote())
    return plotted.frame("layer_distances")


def _legend(*axes) -> None:
    """A legend on the first of ``axes`` that has labelled artists (none when none has)."""
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
            return


def _save(fig, path: Path, footnote: str | None = None) -> None:
    if footnote:
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        fig.text(0.5, 0.01, footnote, ha="center", va="bottom", fontsize="x-small", color="dimgray", wrap=True)
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


LEADERBOARD_TASKS = {
    "leaderboard_bbh": "BBH",
    "leaderboard_math_hard": "MATH",
    "leaderboard_gpqa": "GPQA",
    "leaderboard_musr": "MuSR",
    "leaderboard_mmlu_pro": "MMLU-Pro",
}
LEADERBOARD_MODELS = {"llama2_7b": "Llama 2 7B", "llama3_8b_instruct": "Llama 3 8B Instruct"}


def _suite_tasks(frame: pd.DataFrame) -> list[str]:
    """The tasks whose score and unpruned score the runs record: the leaderboard's in its order,
    then any other suite's (a retargeted rendering) sorted."""
    recorded = {
        c[len("score_") :]
        for c in frame.columns
        if c.startswith("score_")
        and not c.startswith(("score_stderr_", "score_items_"))
        and f"baseline_{c}" in frame.columns
    }
    recorded = {t for t in recorded if _numeric(frame, f"score_{t}").notna().any()}
    return [t for t in LEADERBOARD_TASKS if t in recorded] + sorted(recorded - set(LEADERBOARD_TASKS))


def leaderboard(runs: pd.DataFrame, path: Path, target: Target | None = None) -> pd.DataFrame:
    """Figure "Comparison between our proposed methods and <the baseline> on a different set of benchmarks":
    per paper model (25%: 8 of 32 blocks), each method's score on BBH, MATH, GPQA, MuSR and
    MMLU-Pro divided by the unpruned model's score on the same task (``score_<task>`` /
    ``baseline_score_<task>`` of the same run), averaged over the runs of one setting."""
    plotted = Plotted(target)
    model = plotted.retarget.target.model
    panels = {m: (title, [m]) for m, title in LEADERBOARD_MODELS.items()}
    if model is not None:
        panels = {model: (model, list(LEADERBOARD_MODELS))}
    methods = {series.label: series.conditions for series in series_of("leaderboard")}
    fig_width = 12 if len(panels) > 1 else 6
    fig, axes = _pyplot().subplots(1, len(panels), figsize=(fig_width, 3.8), sharey=True, squeeze=False)
    for ax, (panel, (title, paper_models)) in zip(axes[0], panels.items()):
        where = {**METHOD_FREE, "model": paper_models[0], "n_prune": 8, "eval": "leaderboard"}
        for other in paper_models[1:]:
            plotted.retarget.conditions({**where, "model": other})
        chosen = {}
        for label, method in methods.items():
            choice = choose_setting(plotted.runs(runs, {**where, **method}))
            plotted.tally.show(choice.shown)
            if choice.shown is not None:
                chosen[label] = (choice.shown, choice.note(label))
        tasks = _suite_tasks(pd.concat([c for c, _ in chosen.values()])) if chosen else []
        width = 0.8 / len(methods)  # every panel leaves each method its place and colour
        for label, (frame, note) in chosen.items():
            i = list(methods).index(label)
            ratios = [_numeric(frame, f"score_{t}") / _numeric(frame, f"baseline_score_{t}") for t in tasks]
            points = pd.DataFrame(
                [
                    {"x": t, "mean": r.mean(), "std": r.std() if r.count() > 1 else 0.0, "n": int(r.count())}
                    for t, r in zip(tasks, ratios)
                ]
            )
            points = points[points["n"] > 0] if not points.empty else points
            if points.empty:
                continue
            points["note"] = note
            plotted.add(panel, label, points)
            positions = [tasks.index(t) + i * width for t in points["x"]]
            color = ("green", "blue", "red")[i]
            bars = ax.bar(positions, points["mean"], width, yerr=points["std"], capsize=2, label=label, color=color)
            ax.bar_label(bars, fmt="%.2f", fontsize="xx-small")
        if not plotted.rows or all(r["panel"] != panel for r in plotted.rows):
            matched = sum(len(c) for c, _ in chosen.values())
            plotted.no_runs(ax, "+paper=leaderboard", matched, "leaderboard scores with the unpruned model's")
        else:
            ax.set_xticks([k + width * (len(methods) - 1) / 2 for k in range(len(tasks))])
            ax.set_xticklabels([LEADERBOARD_TASKS.get(t, t) for t in tasks], fontsize="small")
            ax.axhline(1.0, color="orange", linestyle="--", lw=1)
        ax.set(title=title, ylabel="Score / unpruned model's")
        ax.grid(alpha=0.3, axis="y")
    _legend(*axes[0])
    _save(fig, path, plotted.footnote(_settings_footnote(plotted)))
    return plotted.frame("leaderboard")


# The methods figure's speedup (x) and its two quality panels: (column, title, lower is better).
SPEEDUP = "speed_decode_b1_speedup"
QUALITY_PANELS = (("ppl_heldout", "Held-out perplexity", True), ("avg_acc", "Average accuracy", False))


def _interval(run: pd.Series, metric: str) -> tuple[float, float]:
    """``run``'s recorded interval of ``metric`` (``_ci_low`` / ``_ci_high``, or a speedup's ``_min`` /
    ``_max`` over its timing rounds); NaN where none is recorded."""
    for low, high in (("_ci_low", "_ci_high"), ("_min", "_max")):
        if f"{metric}{low}" in run.index and f"{metric}{high}" in run.index:
            values = pd.to_numeric(pd.Series([run[f"{metric}{low}"], run[f"{metric}{high}"]]), errors="coerce")
            return float(values.iloc[0]), float(values.iloc[1])
    return np.nan, np.nan


def pareto_front(
    points: list[tuple[float, float]],
    lower_is_better: bool,
    intervals: list[tuple[tuple[float, float], tuple[float, float]]] | None = None,
) -> list[int]:
    """The indices of ``points`` ``(speedup, quality)`` that no other point beats, sorted by speedup.

    A point is beaten by another that is better beyond noise on one axis and not worse beyond noise on
    the other. With ``intervals`` (each point's ``((speedup low, high), (quality low, high))``, e.g. 95%
    intervals) "beyond noise" means the two intervals do not overlap, so points whose differences their
    measurements cannot separate all stay on the front; without them (or for a point without one) the
    values themselves are compared, and a point is beaten by one as fast or faster and as good or
    better, strictly on one axis."""
    sign = 1.0 if lower_is_better else -1.0
    spans = [
        (_span(x, box[0] if box else None), _span(sign * y, _signed(box[1], sign) if box else None))
        for (x, y), box in zip(points, intervals or [None] * len(points))
    ]

    def beats(j: int, i: int) -> bool:  # higher speedup and lower signed quality are better
        (xj, yj), (xi, yi) = spans[j], spans[i]
        faster, not_slower = xj[0] > xi[1], xj[1] >= xi[0]
        better, not_worse = yj[1] < yi[0], yj[0] <= yi[1]
        return (faster and not_worse) or (better and not_slower)

    front = [i for i in range(len(points)) if not any(beats(j, i) for j in range(len(points)) if j != i)]
    return sorted(front, key=lambda i: points[i][0])


def _span(value: float, interval: tuple[float, float] | None) -> tuple[float, float]:
    """``interval`` as (low, high), or the value itself where there is none."""
    if interval is None or not all(np.isfinite(v) for v in interval):
        return (value, value)
    return (min(interval), max(interval))


def _signed(interval: tuple[float, float], sign: float) -> tuple[float, float]:
    return (sign * interval[0], sign * interval[1])


def _methods_points(runs: pd.DataFrame, tables: list, plotted: Plotted) -> tuple[list[dict], dict[str, float]]:
    """Each measured row of the methods ``tables`` with a run: ``{"label": "<row> (<fraction>%)", "run": its
    latest run of the shown setting, "note"}``; and the unpruned model's value of each quality metric."""
    found: list[dict] = []
    unpruned: dict[str, float] = {}
    for table in tables:
        fraction = table.where["n_prune"].fraction
        for row in (r for r in table.row_specs() if r.kind == "measured"):
            choice = choose_setting(plotted.runs(runs, {**table.where, **row.conditions}))
            plotted.tally.show(choice.shown)
            if choice.shown is None:
                continue
            run = choice.shown.iloc[-1]  # one run a point: its intervals are the run's
            found.append({"label": f"{row.label} ({100 * fraction:g}%)", "run": run, "note": choice.note(row.label)})
            for metric, _, _ in QUALITY_PANELS:
                if (value := _baseline(choice.shown, metric)) is not None:
                    unpruned[metric] = value
    return found, unpruned


def quality_speed(runs: pd.DataFrame, path: Path, target: Target | None = None) -> pd.DataFrame:
    """Beyond the paper, the methods tables' figure: each method's held-out perplexity and average
    accuracy against its decode speedup at batch 1 (over the unpruned model, measured alternately in its
    job), at every compression of the tables, with 95% intervals as error bars, the unpruned model at
    speedup 1, and the Pareto front of each panel."""
    plotted = Plotted(target)
    tables = [table_named(name) for name in METHODS_TABLES]
    plotted.retarget = Retargeting(target, tables[0].home, "the figure's default")
    found, unpruned = _methods_points(runs, tables, plotted)
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 4.2))
    for ax, (metric, title, lower) in zip(axes, QUALITY_PANELS):
        points = []
        for entry in found:
            x, y = (_numeric(entry["run"].to_frame().T, c).iloc[0] for c in (SPEEDUP, metric))
            if np.isfinite(x) and np.isfinite(y):
                points.append((entry, float(x), float(y)))
        if not points:
            plotted.no_runs(ax, "+methods=equal_compression", len(found), f"{SPEEDUP} and {metric}")
            ax.set(title=title)
            continue
        boxes = [(_interval(entry["run"], SPEEDUP), _interval(entry["run"], metric)) for entry, _, _ in points]
        ordered = pareto_front([(x, y) for _, x, y in points], lower, boxes)  # by speedup
        front = set(ordered)
        for i, (entry, x, y) in enumerate(points):
            (xl, xh), (yl, yh) = _interval(entry["run"], SPEEDUP), _interval(entry["run"], metric)
            xerr = [[x - xl], [xh - x]] if np.isfinite(xl) else None
            yerr = [[y - yl], [yh - y]] if np.isfinite(yl) else None
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o" if "(25%)" in entry["label"] else "s", capsize=2,
                        color="tab:red" if i in front else "tab:blue")  # fmt: skip
            ax.annotate(entry["label"], (x, y), fontsize="xx-small", xytext=(3, 3), textcoords="offset points")
            note = "; ".join(filter(None, ["on the Pareto front" if i in front else "", entry["note"]]))
            plotted.add(metric, entry["label"], pd.DataFrame([{"x": x, "mean": y, "std": 0.0, "n": 1, "note": note}]))
        ax.plot([points[i][1] for i in ordered], [points[i][2] for i in ordered], "--", color="tab:red", alpha=0.5,
                label="Pareto front")  # fmt: skip
        if metric in unpruned:
            ax.axhline(unpruned[metric], color="orange", linestyle="--", label="unpruned (speedup 1)")
            plotted.add(metric, "unpruned", pd.DataFrame([{"x": 1.0, "mean": unpruned[metric], "std": 0.0, "n": 1}]))
        if lower:
            ax.set_yscale("log")
        ax.set(title=f"{title} vs. decode speedup", xlabel="Decode speedup at batch 1 (x unpruned)", ylabel=title)
        ax.grid(alpha=0.3)
    _legend(*axes)
    footnote = (
        "Circles: 25% of the blocks, squares: 37.5%; red: the Pareto front (no other point is better beyond "
        "noise on one axis, its interval apart, and not worse beyond noise on the other). Bars: 95% intervals "
        "(perplexity: bootstrap over windows; avg-acc: over items; speedup: the range of its timing rounds)."
    )
    _save(fig, path, plotted.footnote(footnote, _settings_footnote(plotted)))
    return plotted.frame("methods_quality_speed")


@dataclass(frozen=True)
class FigureSpec:
    """A figure of the paper: its name, how it is drawn (``draw(runs, png, target=None)`` -> the
    plotted numbers) and the sweeps that fill it."""

    name: str
    draw: Callable
    sweeps: tuple[Sweep, ...]


FIGURES: dict[str, FigureSpec] = {
    figure.name: figure
    for figure in (
        FigureSpec("calibration_size", calibration_size, (Sweep("paper/calibration_size", 10),)),
        FigureSpec(
            "pruned_layers",
            pruned_layers,
            (Sweep("paper/pruned_layers", 42), Sweep("paper/pruned_layers_falcon", 30)),
        ),
        FigureSpec("time_emissions", time_emissions, (Sweep("paper/time_emissions", 3),)),
        FigureSpec("block_selection", block_selection, (Sweep("paper/block_selection", 72),)),
        FigureSpec("layer_distances", layer_distances, (Sweep("paper/layer_distances", 1),)),
        FigureSpec("leaderboard", leaderboard, (Sweep("paper/leaderboard", 6),)),
        FigureSpec("methods_quality_speed", quality_speed, (Sweep("methods/equal_compression", 30),)),
    )
}
for _figure in FIGURES.values():
    register(_figure.name, "figure", _figure.sweeps, _figure)


def write_paper_figures(
    runs: pd.DataFrame, out_dir: str | Path, target: Target | None = None, echo=None, only: list[str] | None = None
) -> list[Path]:
    """Write ``<name>.png`` and its plotted numbers ``<name>.csv`` for every figure (those named in
    ``only``, when given; retargeted to ``target``, if given); returns the files written. ``echo``
    (e.g. ``print``) gets each figure's count line."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for figure in FIGURES.values():
        if only is not None and figure.name not in only:
            continue
        png, csv = (out / f"{file_name(figure.name)}{suffix}" for suffix in (".png", ".csv"))
        plotted = figure.draw(runs, png, target=target)
        plotted.to_csv(csv, index=False)
        if echo is not None:
            echo("figure " + plotted.attrs["counts"])
        written += [png, csv]
    return written
