"""How far torchmin 0.1.0's transforms and scores are from 0.0.2's (what the official code installed) on the
same tokens (issue 50): the rows of one official-protocol job run once with each version
(``scripts/torchmin-versions.sh`` runs them), compared here.

    python benchmarks/torchmin_versions.py <results of the 0.0.2 job> <results of the 0.1.0 job>

Prints each row's torchmin version and solver steps, the relative Frobenius distance between their
transforms cut by cut, and the paired comparison of held-out perplexity (ratio, 95% interval over
documents) and average accuracy (difference, 95% interval over items)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file

from replaceme_exp.reporting.ties import Cell, compare_cells
from replaceme_exp.results import ResultsStore


def finished_row(results: Path) -> pd.Series:
    rows = ResultsStore(results).load()
    rows = rows[rows["status"] == "finished"]
    if len(rows) != 1:
        raise SystemExit(f"{results}: {len(rows)} finished rows; expected the one job's")
    return rows.iloc[0]


def transforms(results: Path, row: pd.Series) -> dict[str, torch.Tensor]:
    files = sorted((results / "models" / row["config_hash"]).glob("*.safetensors"))
    files = files or sorted((results / "transforms").glob(f"{row['config_hash']}*.safetensors"))
    if not files:
        raise SystemExit(f"{results}: no saved transforms (save_model=transform, or save_transforms=true)")
    return {name: t.double() for f in files for name, t in load_file(f).items()}


def main(a: str, b: str) -> None:
    ra, rb = Path(a), Path(b)
    row_a, row_b = finished_row(ra), finished_row(rb)
    for results, row in ((ra, row_a), (rb, row_b)):
        print(f"{results}: torchmin {row['torchmin_version']}, cuts {row['cuts']}, solver_steps {row.get('solver_steps')}")
    ta, tb = transforms(ra, row_a), transforms(rb, row_b)
    for name in sorted(ta):
        distance = float((ta[name] - tb[name]).norm() / ta[name].norm())
        largest = float((ta[name] - tb[name]).abs().max())
        print(f"{name}: |T_0.1.0 - T_0.0.2|_F / |T_0.0.2|_F = {distance:.3e}, largest element difference {largest:.3e}")
    for metric in ("ppl_heldout", "avg_acc"):
        ca, cb = Cell(row_a[metric], row_a.to_frame().T), Cell(row_b[metric], row_b.to_frame().T)
        found = compare_cells(cb, ca, metric)
        ratio = metric.startswith("ppl")  # compared on the log scale
        shown = math.exp if ratio else float
        what = "ratio" if ratio else "difference"
        interval = (
            "n/a" if found is None else f"{shown(found.estimate):.4g} [{shown(found.low):.4g}, {shown(found.high):.4g}]"
        )
        print(f"{metric}: 0.0.2 {row_a[metric]:.4f}, 0.1.0 {row_b[metric]:.4f}; 0.1.0 against 0.0.2 ({what}): {interval}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
