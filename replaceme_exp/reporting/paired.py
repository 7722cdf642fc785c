"""Every run against a reference method, paired: "is this variant at least level with the best peer
on held-out perplexity and on the tasks at once?"

For each (model, blocks removed), the reference is the best run of the reference method on each
metric (lowest perplexity, highest accuracy). Each other run is compared with it on the same
held-out documents and the same lm-eval items (:func:`~replaceme_exp.reporting.ties.compare_cells`):
a perplexity as the ratio of the two (the exp of the paired log ratio) with its 95% interval, an
accuracy as the difference. Each comparison reads against a margin fixed in advance
(:mod:`~replaceme_exp.reporting.verdicts`, ``margins.yaml``): ahead, level within the margin, behind, or
inconclusive. A run ahead or level on every metric is *level with* the reference.

``--reference best-peer``: on each metric, the best setting of any method that is not a picked variant.
``--picked <prefix>``: the runs whose method starts with the prefix are variants a claim picks the best
of (the ReplaceMe variants of the lead); their intervals are simultaneous over all of them in the cell
(max-T over the same resamples), so picking the best costs what it should.

    python -m replaceme_exp.reporting.paired --results results --results results_lead \\
        --reference <method> [--picked ReplaceMe] [--margin avg_acc=0.02] --out results/paired.md
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from replaceme_exp.intervals import LEVEL, Comparison
from replaceme_exp.methods import METHODS
from replaceme_exp.reporting import verdicts
from replaceme_exp.reporting.ties import (
    Cell,
    compare_cells,
    compare_family,
    draws_interval,
    higher_is_better,
    interval_of,
    on_log_scale,
)
from replaceme_exp.results import ResultsStore
from replaceme_exp.results.row import format_cuts

METRICS = ("ppl_heldout", "avg_acc")
# Settings that tell two runs of one method apart in a label (those that vary among its runs).
LABEL_SETTINGS = (
    "objective",
    "structure",
    "estimation_tokens",
    "selection_metric",
    "regularizer",
    "alpha",
    "lt_placement",
    "solver",
    "num_lts",
    "calibration",
    "n_calib_samples",
)


def label_settings() -> tuple[str, ...]:
    """:data:`LABEL_SETTINGS`, then every method's own setting columns (its plugin's ``setting_columns``),
    so two recipes of one method that differ only in the method's own settings get different labels."""
    own = [name for _, method in METHODS.items() for name in method.setting_columns]
    return LABEL_SETTINGS + tuple(dict.fromkeys(c for c in own if c not in LABEL_SETTINGS))


def _nameable(values: pd.Series) -> bool:
    """Whether a column's values fit in a label: numbers, flags or one-word names, not JSON or prose."""
    words = [v for v in values if isinstance(v, str)]
    return all(len(v) <= 40 and not v.startswith(("{", "[")) and " " not in v for v in words)


def labels(runs: pd.DataFrame) -> pd.Series:
    """Each run's method, with the settings (:func:`label_settings`) in which it differs from another
    run of the same method that it is compared beside (same model and number of blocks removed):
    ``<method> [objective=<objective>]``. A setting that only follows the compression (the number of
    cuts a selection found at 25% and at 37.5%) names nothing."""
    out = runs["method"].astype(str).copy()
    settings = label_settings()
    beside = [c for c in ("model", "n_prune") if c in runs] + ["method"]
    for _, group in runs.groupby(beside, sort=False, dropna=False):
        varying = [c for c in settings if c in group and group[c].astype(str).nunique() > 1 and _nameable(group[c])]
        for index, run in group.iterrows():
            if varying:
                out[index] += " [" + ", ".join(f"{c}={run[c]}" for c in varying) + "]"
    return out


BEST_PEER = "best-peer"


def is_reference(method: str, reference: str, picked: str | None) -> bool:
    """Whether a setting of ``method`` may be the reference: of the reference method, or with
    ``reference=best-peer`` of any method that is not a ``picked`` variant (the best peer on each metric)."""
    if reference == BEST_PEER:
        return not (picked and method.startswith(picked))
    return method == reference


def settings_of(runs: pd.DataFrame) -> list[pd.DataFrame]:
    """``runs`` (one model and compression) as settings: the runs that differ only in the seed or the
    calibration draw (one ``setting_hash``; a run without one alone), in the order first seen."""
    keys = runs["setting_hash"] if "setting_hash" in runs.columns else pd.Series(index=runs.index, dtype=object)
    keys = [k if isinstance(k, str) else f"run:{i}" for i, k in zip(runs.index, keys)]
    order = list(dict.fromkeys(keys))
    return [runs.loc[[i for i, k in zip(runs.index, keys) if k == key]] for key in order]


def _mean(runs: pd.DataFrame, metric: str) -> float | None:
    values = pd.to_numeric(runs[metric], errors="coerce").dropna() if metric in runs.columns else pd.Series([])
    return float(values.mean()) if len(values) else None


def _comparisons(
    settings: list[pd.DataFrame], reference: int, metric: str, picked: str | None
) -> dict[int, tuple[Comparison | None, bool]]:
    """Each setting (its position in ``settings``) against the reference's best setting on ``metric``:
    (comparison, simultaneous). The variants of ``picked`` together: one run each, max-T over the same
    resamples when they share the reference's units; several draws each, a Bonferroni level
    (``1 - 0.05 / k``) on each two-level comparison. Every other setting on its own."""
    ref = settings[reference]
    out: dict[int, tuple[Comparison | None, bool]] = {}
    present = [i for i, runs in enumerate(settings) if i != reference and _mean(runs, metric) is not None]
    family = [i for i in present if picked and str(settings[i]["method"].iloc[0]).startswith(picked)]
    if len(family) > 1 and len(ref) == 1 and all(len(settings[i]) == 1 for i in family):
        joint = compare_family([settings[i].iloc[0] for i in family], ref.iloc[0], metric)
        if joint is not None:
            out.update({i: (c, True) for i, c in zip(family, joint)})
    for i in present:
        if i in out:
            continue
        joint = i in family and len(family) > 1
        level = 1 - (1 - LEVEL) / len(family) if joint else LEVEL
        cell, ref_cell = Cell(_mean(settings[i], metric), settings[i]), Cell(_mean(ref, metric), ref)
        out[i] = (compare_cells(cell, ref_cell, metric, level), joint)
    return out


def paired_table(
    runs: pd.DataFrame,
    reference: str,
    metrics: Sequence[str] = METRICS,
    margins: dict[str, dict] | None = None,
    picked: str | None = None,
) -> pd.DataFrame:
    """One row per setting (its runs: one, or several calibration draws or seeds) that is not the
    reference on every metric, grouped by (model, n_prune): the setting's value (the mean over its runs)
    and interval, its comparison with the reference's best setting (``<metric>_vs``: ratio for a
    log-scale metric, difference otherwise, with ``_low`` / ``_high``, ``_verdict``
    (:func:`~replaceme_exp.reporting.verdicts.read` against ``margins``; ``reference`` where the setting
    is the reference's best) and ``_simultaneous`` (the interval holds jointly over the ``picked``
    variants)), ``runs`` and ``level`` (ahead or level on every metric). Groups without a reference run
    are left out."""
    runs = runs[runs["status"] == "finished"].reset_index(drop=True).copy()
    runs = runs.assign(label=labels(runs))
    out = []
    for (model, n_prune), group in runs.groupby(["model", "n_prune"], sort=True):
        settings = settings_of(group)
        refs = [i for i, s in enumerate(settings) if is_reference(str(s["method"].iloc[0]), reference, picked)]
        if not refs:
            continue
        best = {}
        for metric in metrics:
            values = {i: _mean(settings[i], metric) for i in refs}
            values = {i: v for i, v in values.items() if v is not None}
            if values:
                pick = max if higher_is_better(metric) else min
                best[metric] = pick(values, key=values.get)
        compared = {metric: _comparisons(settings, best[metric], metric, picked) for metric in best}
        for index, setting in enumerate(settings):
            if best and all(index == b for b in best.values()):
                continue
            first = setting.iloc[0]
            cuts = " / ".join(dict.fromkeys(format_cuts(c, missing="") for c in setting.get("cuts", [None])))
            row = {"model": model, "n_prune": n_prune, "label": first["label"], "cuts": cuts, "runs": len(setting)}
            found = []
            for metric in metrics:
                row[metric] = _mean(setting, metric)
                low, high = interval_of(first, metric) if len(setting) == 1 else (None, None)
                if len(setting) > 1 and (interval := draws_interval(setting, metric)) is not None:
                    low, high = interval
                row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = low, high
                if metric not in best or row[metric] is None:
                    continue
                if index == best[metric]:
                    row[f"{metric}_verdict"] = "reference"
                    found.append("reference")
                    continue
                comparison, simultaneous = compared[metric].get(index, (None, False))
                if comparison is None:
                    continue
                margin = verdicts.margin_on_comparison_scale(metric, margins)
                scale = math.exp if on_log_scale(metric) else float
                row[f"{metric}_vs"] = scale(comparison.estimate)
                row[f"{metric}_vs_low"], row[f"{metric}_vs_high"] = scale(comparison.low), scale(comparison.high)
                row[f"{metric}_vs_method"] = comparison.method
                row[f"{metric}_simultaneous"] = simultaneous
                if margin is None:
                    raise ValueError(f"no margin for {metric}: give one (--margin {metric}=<value>)")
                row[f"{metric}_verdict"] = verdicts.read(comparison, higher_is_better(metric), margin)
                found.append(row[f"{metric}_verdict"])
            # level: compared (or the reference itself) on every metric, and ahead or level on each
            good = {verdicts.AHEAD, verdicts.LEVEL, "reference"}
            row["level"] = (len(found) == len(best) and set(found) <= good) if found else None
            out.append(row)
    return pd.DataFrame(out)


def _number(value: float, digits: int, sign: str = "") -> str:
    """``value`` with ``digits`` decimals, or from a million up with 4 significant digits (1.371e+18):
    a collapsed run's perplexity would otherwise print all its integer digits."""
    if abs(value) >= 1e6:
        return f"{value:{sign}.4g}"
    return f"{value:{sign}.{digits}f}"


def _interval(value, low, high, digits: int, sign: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    shown = _number(value, digits, sign)
    if low is None or high is None:
        return shown
    return f"{shown} [{_number(low, digits, sign)}, {_number(high, digits, sign)}]"


def to_markdown(
    table: pd.DataFrame, reference: str, metrics: Sequence[str] = METRICS, margins: dict[str, dict] | None = None
) -> str:
    """The table as markdown, one section per (model, blocks removed), under the margins it reads against.
    An interval simultaneous over picked variants is marked ``*``."""
    stated = ", ".join(f"{m}: {verdicts.margin_text(m, margins)}" for m in metrics)
    lines = [
        f"Margins (fixed in advance): {stated}. Verdicts: ahead (better beyond noise), level (a deficit larger "
        "than the margin excluded), behind, inconclusive (the interval reaches past the margin and past 0). "
        "`*`: an interval simultaneous over the picked variants of its cell (max-T).",
        "",
    ]
    for (model, n_prune), group in table.groupby(["model", "n_prune"], sort=True):
        lines += [f"### {model}, {int(n_prune)} blocks removed: each run against {reference}'s best", ""]
        head = ["run", "cuts"]
        for metric in metrics:
            head += [f"{metric} [95%]", f"vs {reference} [95%]"]
        lines += ["| " + " | ".join(head + ["level"]) + " |", "|" + "---|" * (len(head) + 1)]
        for _, row in group.iterrows():
            runs = row.get("runs")
            shown = f"{row['label']} ({int(runs)} runs)" if isinstance(runs, (int, float)) and runs > 1 else row["label"]
            cells = [shown, row["cuts"]]
            for metric in metrics:
                digits = 1 if on_log_scale(metric) else 3
                low, high = row.get(f"{metric}_ci_low"), row.get(f"{metric}_ci_high")
                cells.append(_interval(row.get(metric), low, high, digits))
                verdict_ = row.get(f"{metric}_verdict")
                if verdict_ == "reference":
                    cells.append("reference")
                elif isinstance(verdict_, str):
                    sign = "" if on_log_scale(metric) else "+"
                    vs, low, high = (row[f"{metric}_vs{end}"] for end in ("", "_low", "_high"))
                    joint = "*" if row.get(f"{metric}_simultaneous") is True else ""
                    cells.append(f"{_interval(vs, low, high, 3, sign)}{joint} {verdict_}")
                else:
                    cells.append("—")
            level = row.get("level")
            cells.append("yes" if level is True else "no" if level is False else "—")
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def load_runs(paths: Sequence[str]) -> pd.DataFrame:
    frames = [ResultsStore(Path(p)).load() for p in paths]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def margins_given(given: Sequence[str]) -> dict[str, dict]:
    """The shipped margins with ``metric=value`` entries replacing theirs (a perplexity or speedup's value is
    a ratio, any other a difference); one line naming the bad entry otherwise."""
    margins = dict(verdicts.shipped_margins())
    for entry in given:
        metric, _, value = entry.partition("=")
        try:
            number = float(value)
        except ValueError:
            raise SystemExit(f"--margin {entry!r}: give metric=number") from None
        kind = "ratio" if on_log_scale(metric) else "difference"
        if not math.isfinite(number) or (number <= 1 if kind == "ratio" else number <= 0):
            raise SystemExit(
                f"--margin {entry!r}: a {kind} margin must be {'above 1' if kind == 'ratio' else 'positive'}"
            )
        margins[metric] = {"kind": kind, "value": number}
    return margins


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", action="append", required=True, help="a results directory (repeatable)")
    parser.add_argument(
        "--reference",
        required=True,
        help=f"the method every run is compared with ('method' column), or {BEST_PEER}: on each metric the best "
        "setting of any method that is not a --picked variant",
    )
    parser.add_argument("--model", default=None, help="only runs of this model")
    parser.add_argument("--metrics", default=",".join(METRICS))
    parser.add_argument("--out", default=None, help="write the markdown here (and a .json beside it)")
    parser.add_argument(
        "--margin", action="append", default=[], help="metric=value: replaces that metric's margin (repeatable)"
    )
    parser.add_argument("--picked", default=None, help="method prefix of the variants a claim picks the best of")
    args = parser.parse_args(argv)
    margins = margins_given(args.margin)
    if args.reference == BEST_PEER and not args.picked:
        raise SystemExit(f"--reference {BEST_PEER}: name the variants that are no peers with --picked <prefix>")
    runs = load_runs(args.results)
    if runs.empty:
        raise SystemExit(f"--results {args.results}: no runs there")
    if args.model:
        runs = runs[runs["model"] == args.model]
    metrics = [m for m in args.metrics.split(",") if m]
    if args.reference != BEST_PEER and args.reference not in set(runs["method"]):
        known = ", ".join(sorted(set(runs["method"].astype(str))))
        raise SystemExit(f"--reference {args.reference!r}: no run of that method (methods: {known})")
    try:
        table = paired_table(runs, args.reference, metrics, margins, args.picked)
    except ValueError as err:
        raise SystemExit(f"--margin: {err}") from err
    text = to_markdown(table, args.reference, metrics, margins)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(table.to_dict("records"), indent=1, default=str))
    print(text)


if __name__ == "__main__":
    main()
