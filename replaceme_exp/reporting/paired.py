"""Every run against a reference method, paired: "is this variant at least tied with the best peer
on held-out perplexity and on the tasks at once?"

For each (model, blocks removed), the reference is the best run of the reference method on each
metric (lowest perplexity, highest accuracy). Each other run is compared with it on the same
held-out windows and the same lm-eval items (:func:`~replaceme_exp.reporting.ties.compare_cells`):
a perplexity as the ratio of the two (the exp of the paired log ratio) with its 95% interval, an
accuracy as the difference. A comparison whose interval contains 0 (ratio 1) is a tie; a run tied
or ahead on every metric is *level with* the reference.

    python -m replaceme_exp.reporting.paired --results results --results results_lead \\
        --reference <method> --out results/paired.md
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from replaceme_exp.methods import METHODS
from replaceme_exp.reporting.ties import Cell, compare_cells, higher_is_better, interval_of, on_log_scale
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
AHEAD, TIE, BEHIND = "ahead", "tie", "behind"


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


def verdict(metric: str, estimate: float, tie: bool) -> str:
    """``ahead`` / ``tie`` / ``behind`` the reference, from a comparison's estimate (a - reference;
    for a perplexity the log of their ratio)."""
    if tie:
        return TIE
    better = estimate > 0 if higher_is_better(metric) else estimate < 0
    return AHEAD if better else BEHIND


def paired_table(runs: pd.DataFrame, reference: str, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """One row per finished run that is not the reference on every metric, grouped by (model,
    n_prune): the run's value and interval, its comparison with the reference's best run
    (``<metric>_vs``: ratio for a log-scale metric, difference otherwise, with ``_low`` / ``_high``
    and ``_verdict``: ``reference`` where the run is the reference's best), and ``level`` (no metric
behind). Groups without a reference run are left out."""
    runs = runs[runs["status"] == "finished"].reset_index(drop=True).copy()
    runs = runs.assign(label=labels(runs))
    out = []
    for (model, n_prune), group in runs.groupby(["model", "n_prune"], sort=True):
        ref = group[group["method"] == reference]
        if ref.empty:
            continue
        best = {}
        for metric in metrics:
            values = pd.to_numeric(ref[metric], errors="coerce")
            if values.notna().any():
                best[metric] = values.idxmax() if higher_is_better(metric) else values.idxmin()
        for index, run in group.iterrows():
            if best and all(index == b for b in best.values()):
                continue
            cuts = format_cuts(run.get("cuts"), missing="")
            row = {"model": model, "n_prune": n_prune, "label": run["label"], "cuts": cuts}
            verdicts = []
            for metric in metrics:
                value = pd.to_numeric(run.get(metric), errors="coerce")
                row[metric] = None if pd.isna(value) else float(value)
                row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = interval_of(run, metric)
                if metric not in best or row[metric] is None:
                    continue
                b = group.loc[best[metric]]
                if index == best[metric]:
                    row[f"{metric}_verdict"] = "reference"
                    verdicts.append("reference")
                    continue
                comparison = compare_cells(
                    Cell(row[metric], group.loc[[index]]), Cell(float(b[metric]), group.loc[[best[metric]]]), metric
                )
                if comparison is None:
                    continue
                scale = math.exp if on_log_scale(metric) else float
                row[f"{metric}_vs"] = scale(comparison.estimate)
                row[f"{metric}_vs_low"], row[f"{metric}_vs_high"] = scale(comparison.low), scale(comparison.high)
                row[f"{metric}_vs_method"] = comparison.method
                row[f"{metric}_verdict"] = verdict(metric, comparison.estimate, comparison.tie)
                verdicts.append(row[f"{metric}_verdict"])
            # level: compared (or the reference itself) on every metric and behind on none
            row["level"] = len(verdicts) == len(best) and BEHIND not in verdicts if verdicts else None
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


def to_markdown(table: pd.DataFrame, reference: str, metrics: Sequence[str] = METRICS) -> str:
    """The table as markdown, one section per (model, blocks removed)."""
    lines = []
    for (model, n_prune), group in table.groupby(["model", "n_prune"], sort=True):
        lines += [f"### {model}, {int(n_prune)} blocks removed: each run against {reference}'s best", ""]
        head = ["run", "cuts"]
        for metric in metrics:
            head += [f"{metric} [95%]", f"vs {reference} [95%]"]
        lines += ["| " + " | ".join(head + ["level"]) + " |", "|" + "---|" * (len(head) + 1)]
        for _, row in group.iterrows():
            cells = [row["label"], row["cuts"]]
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
                    cells.append(f"{_interval(vs, low, high, 3, sign)} {verdict_}")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", action="append", required=True, help="a results directory (repeatable)")
    parser.add_argument("--reference", required=True, help="the method every run is compared with ('method' column)")
    parser.add_argument("--model", default=None, help="only runs of this model")
    parser.add_argument("--metrics", default=",".join(METRICS))
    parser.add_argument("--out", default=None, help="write the markdown here (and a .json beside it)")
    args = parser.parse_args(argv)
    runs = load_runs(args.results)
    if runs.empty:
        raise SystemExit(f"--results {args.results}: no runs there")
    if args.model:
        runs = runs[runs["model"] == args.model]
    metrics = [m for m in args.metrics.split(",") if m]
    if args.reference not in set(runs["method"]):
        known = ", ".join(sorted(set(runs["method"].astype(str))))
        raise SystemExit(f"--reference {args.reference!r}: no run of that method (methods: {known})")
    table = paired_table(runs, args.reference, metrics)
    text = to_markdown(table, args.reference, metrics)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(table.to_dict("records"), indent=1, default=str))
    print(text)


if __name__ == "__main__":
    main()
