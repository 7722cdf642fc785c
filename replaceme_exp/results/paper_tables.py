"""The paper's tables from the results store: one Markdown and one LaTeX file per table.

Each table is declared by a :class:`TableSpec`: which runs it reads (``where``), one row per
setting (a label and the column values that select its runs) and one column per metric. A cell
averages the finished runs behind it (the latest run per config hash, so every seed counts
once) and says how many there are: ``0.634`` for one run, ``0.634 ± 0.002 (n=3)`` for several,
``—`` (missing) for none. Numbers quoted from other papers are never mixed in: they would be
listed separately with their source.

    python -m replaceme_exp.results.paper_tables --results results --out results/paper_tables
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from replaceme_exp.results.store import ResultsStore

MISSING = "—"
PAPER_COLUMNS = [("Avg-acc", "avg_acc"), ("Perplexity", "ppl_lambada"), ("RP", "rp")]
# The paper's method unless a row says otherwise (a row's conditions override these).
DEFAULT_METHOD = {"structure": "generic", "lt_placement": "fused", "mask_ratio": 0.0, "num_lts": 1}
LLAMA3_25 = {**DEFAULT_METHOD, "model": "llama3_8b_instruct", "n_prune": 8, "eval": "paper"}


@dataclass
class TableSpec:
    name: str
    caption: str
    where: dict
    rows: list[tuple[str, dict]]
    columns: list[tuple[str, str]] = field(default_factory=lambda: list(PAPER_COLUMNS))


TABLES = [
    TableSpec(
        "regularization",
        "The effect of regularization on LS and cosine methods (Llama 3 8B Instruct, 25%).",
        LLAMA3_25,
        [(f"LS, alpha={a:g}", {"objective": "ls", "alpha": a}) for a in (0, 0.1, 0.5, 10, 100, 1000, 10000)]
        + [
            ("Cosine", {"objective": "cosine", "alpha": 0.0}),
            ("Cosine + L2, alpha=0.01", {"objective": "cosine", "regularizer": "l2", "alpha": 0.01}),
            ("Cosine + L1, alpha=1e-4", {"objective": "cosine", "regularizer": "l1", "alpha": 0.0001}),
        ],
    ),
    TableSpec(
        "structured_lts",
        "Structure of the LT matrix (Llama 3 8B Instruct, 25%, LS).",
        {**LLAMA3_25, "objective": "ls"},
        [(s.capitalize(), {"structure": s}) for s in ("generic", "diagonal", "orthonormal")],
    ),
    TableSpec(
        "solvers",
        "Solvers for the cosine objective, and MSE (Adam) against the LS closed form (Llama 3 8B Instruct, 25%).",
        LLAMA3_25,
        [(f"Cosine, {s}", {"objective": "cosine", "solver": s}) for s in ("adam", "nlcg", "trust_ncg", "lbfgs")]
        + [("MSE, adam", {"objective": "mse", "solver": "adam"}), ("LS (closed form)", {"objective": "ls"})],
    ),
    TableSpec(
        "multi_lt_count",
        "ReplaceMe (LS) with 1, 2, 4 or 8 transforms for 8 pruned blocks.",
        {**DEFAULT_METHOD, "n_prune": 8, "objective": "ls", "eval": "paper"},
        [
            (f"{m}, {k} LT", {"model": m, "num_lts": k})
            for m in ("llama3_8b_instruct", "mistral_7b_instruct_v03")
            for k in (1, 2, 4, 8)
        ],
        [(t.capitalize(), f"acc_{t}") for t in ("race", "winogrande", "piqa", "boolq", "openbookqa", "sciq")]
        + [("Perplexity", "ppl_lambada"), ("Avg. Acc", "avg_acc")],
    ),
    TableSpec(
        "fused_vs_separate",
        "Mergeable LT vs. LT as an independent block (Llama 3 8B Instruct, 25%, cosine).",
        {**LLAMA3_25, "objective": "cosine"},
        [("Fusable into MLP", {"lt_placement": "fused"}), ("Separate LT block", {"lt_placement": "separate"})],
    ),
    TableSpec(
        "cosine_approximation",
        "The approximated cosine loss against the original one.",
        {**DEFAULT_METHOD, "eval": "paper"},
        [
            ("Llama 3 8B, approx. loss", {"model": "llama3_8b_instruct", "n_prune": 8, "objective": "cosine"}),
            ("Llama 3 8B, orig. loss", {"model": "llama3_8b_instruct", "n_prune": 8, "objective": "cosine_exact"}),
            ("Qwen 2.5 7B, approx. loss", {"model": "qwen25_7b_instruct", "n_prune": 7, "objective": "cosine"}),
            ("Qwen 2.5 7B, orig. loss", {"model": "qwen25_7b_instruct", "n_prune": 7, "objective": "cosine_exact"}),
        ],
        [("Perplexity", "ppl_lambada"), ("Avg-acc", "avg_acc")],
    ),
    TableSpec(
        "masking",
        "Random token masking during the estimation (Llama 3 8B Instruct, 25%, cosine).",
        {**LLAMA3_25, "objective": "cosine"},
        [
            (f"{n // 1000}k samples, {'masked' if m else 'no masking'}", {"n_calib_samples": n, "mask_ratio": m})
            for n in (1000, 8000)
            for m in (0.0, 0.25)
        ],
    ),
    TableSpec(
        "calibration_types",
        "Calibration data (Llama 3 8B Instruct, 25%).",
        LLAMA3_25,
        [
            (f"{o.upper() if o == 'ls' else o.capitalize()}, {c}", {"objective": o, "calibration": c})
            for o in ("ls", "cosine")
            for c in ("fineweb", "slimorca", "slimorca_fineweb")
        ],
    ),
]


def _matches(table: pd.DataFrame, conditions: dict) -> pd.Series:
    mask = pd.Series(True, index=table.index)
    for key, value in conditions.items():
        if key not in table.columns:
            return pd.Series(False, index=table.index)
        column = table[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            mask &= pd.to_numeric(column, errors="coerce").sub(value).abs() < 1e-12
        else:
            mask &= column == value
    return mask


def format_cell(values: pd.Series) -> str:
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return MISSING
    if len(values) == 1:
        return f"{values.iloc[0]:.4g}"
    std = values.std(ddof=1)
    return f"{values.mean():.4g} ± {std:.2g} (n={len(values)})" if not math.isnan(std) else f"{values.mean():.4g}"


def build_table(spec: TableSpec, runs: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``spec`` as displayed strings, plus the number of runs behind each row. A row's
    runs match ``spec.where`` updated with the row's own conditions."""
    finished = runs[runs["status"] == "finished"] if not runs.empty else runs
    out = []
    for label, conditions in spec.rows:
        selected = finished[_matches(finished, {**spec.where, **conditions})] if not finished.empty else finished
        row = {"Setting": label, "Runs": len(selected)}
        for header, column in spec.columns:
            row[header] = format_cell(selected[column]) if column in selected.columns else MISSING
        out.append(row)
    return pd.DataFrame(out)


def to_markdown(spec: TableSpec, table: pd.DataFrame) -> str:
    headers = list(table.columns)
    lines = [f"**{spec.name}**: {spec.caption}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    lines += ["", f"Cells average the finished runs behind them (seeds); {MISSING} = no run."]
    return "\n".join(lines) + "\n"


def to_latex(spec: TableSpec, table: pd.DataFrame) -> str:
    def esc(v) -> str:
        return str(v).replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace(MISSING, "--")

    headers = list(table.columns)
    lines = [r"\begin{table}[h]", r"\centering", r"\begin{tabular}{l" + "c" * (len(headers) - 1) + "}", r"\toprule"]
    lines.append(" & ".join(rf"\textbf{{{esc(h)}}}" for h in headers) + r" \\")
    lines.append(r"\midrule")
    lines += [" & ".join(esc(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        rf"\caption{{{esc(spec.caption)}}}",
        rf"\label{{tab:{spec.name}}}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def write_paper_tables(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Write ``<name>.md`` and ``<name>.tex`` for every table; returns the files written."""
    runs = ResultsStore(results_dir).load(latest_per_config=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in TABLES:
        table = build_table(spec, runs)
        for suffix, render in ((".md", to_markdown), (".tex", to_latex)):
            path = out / f"{spec.name}{suffix}"
            path.write_text(render(spec, table))
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default="results/paper_tables")
    args = parser.parse_args()
    for path in write_paper_tables(args.results, args.out):
        print(path)


if __name__ == "__main__":
    main()
