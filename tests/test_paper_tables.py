"""make paper-tables on a store built by a small real sweep plus synthetic paper-scale rows."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT
from test_job import job_config

from replaceme_exp.job import run_recorded
from replaceme_exp.results import ResultsStore
from replaceme_exp.results.paper_tables import MISSING, TABLES


def synthetic_row(i: int, **values) -> dict:
    row = dict(
        run_id=f"r{i}",
        config_hash=f"h{i}",
        status="finished",
        started_at=f"2026-01-01T00:00:{i:02d}",
        model="llama3_8b_instruct",
        n_prune=8,
        eval="paper",
        objective="ls",
        alpha=0.0,
        regularizer="none",
        structure="generic",
        solver=None,
        lt_placement="fused",
        mask_ratio=0.0,
        num_lts=1,
    )
    row.update(values)
    return row


def test_tables_show_measured_cells_with_their_runs_and_mark_missing_ones(tmp_path):
    assert run_recorded(job_config(tmp_path, "save_model=false"))["status"] == "finished"  # a real (tiny) row
    store = ResultsStore(tmp_path)
    store.write(synthetic_row(1, avg_acc=0.62, ppl_lambada=21.0, rp=0.89, seed=1))
    store.write(synthetic_row(2, avg_acc=0.64, ppl_lambada=23.0, rp=0.91, seed=2))
    store.write(synthetic_row(3, avg_acc=0.70, ppl_lambada=30.0, rp=0.99, alpha=10000.0, regularizer="l2"))
    store.write(synthetic_row(4, avg_acc=0.10, status="failed"))  # never shown
    store.write(synthetic_row(5, avg_acc=0.55, structure="diagonal", ppl_lambada=40.0, rp=0.8))

    out = tmp_path / "paper_tables"
    proc = subprocess.run(
        [sys.executable, "-m", "replaceme_exp.results.paper_tables", "--results", str(tmp_path), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in out.iterdir()} == {f"{t.name}{s}" for t in TABLES for s in (".md", ".tex")}

    regularization = (out / "regularization.md").read_text()
    assert "| LS, alpha=0 | 2 | 0.63 ± 0.014 (n=2) | 22 ± 1.4 (n=2) | 0.9 ± 0.014 (n=2) |" in regularization
    assert "| LS, alpha=10000 | 1 | 0.7 | 30 | 0.99 |" in regularization
    assert f"| LS, alpha=0.1 | 0 | {MISSING} | {MISSING} | {MISSING} |" in regularization
    structured = (out / "structured_lts.md").read_text()
    assert "| Diagonal | 1 | 0.55 | 40 | 0.8 |" in structured and f"| Orthonormal | 0 | {MISSING}" in structured
    latex = (out / "regularization.tex").read_text()
    assert r"\toprule" in latex and r"0.63 $\pm$ 0.014 (n=2)" in latex and "LS, alpha=0.1 & 0 & -- & -- & --" in latex
