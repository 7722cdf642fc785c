"""Leaders of a column and ties within noise (replaceme_exp/reporting/ties.py), in the methods table and in
a sweep's report: rows built from windows and items with known differences."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers.tables import SPECS, cells, frame, measured, run

from replaceme_exp.reporting.paper_tables import build_table, load_quoted, to_latex, to_markdown
from replaceme_exp.reporting.report import Group, runs_table
from replaceme_exp.reporting.ties import LEADER, TIED, Cell, compare_cells, mark_column


SPEC = SPECS["methods_equal_compression"]
def test_the_best_and_every_row_within_noise_of_it_lead_the_column():
    rows = frame(
        measured(1, "LinearPatch", 1.000, (300, 200)),
        measured(2, "ShortGPT", 1.003, (298, 200), noise=0.03),  # 0.3% worse on average; two items fewer
        measured(3, "ReplaceMe LS", 1.10, (340, 230)),  # 10% worse perplexity, 70 more items right
        measured(4, "UIDL", 1.5, (100, 100)),
    )
    table = build_table(SPEC, rows, load_quoted())
    lp, sg = cells(table, "LinearPatch"), cells(table, "ShortGPT")
    ls, uidl = cells(table, "ReplaceMe LS"), cells(table, "UIDL")
    assert lp["Held-out ppl"].startswith("**") and sg["Held-out ppl"].startswith("**")  # tied: 0.3% is noise here
    assert not ls["Held-out ppl"].startswith("**") and not uidl["Held-out ppl"].startswith("**")
    assert ls["Avg-acc"].startswith("**") and not lp["Avg-acc"].startswith("**")
    assert "[" in lp["Held-out ppl"] and "]" in lp["Held-out ppl"]  # the run's interval
    assert table.attrs["leaders"]
    markdown = to_markdown(SPEC, table)
    assert "Bold: the best value of a column and every value within noise of it" in markdown
    assert r"\textbf{" in to_latex(SPEC, table)


def test_pairing_decides_a_tie_that_the_intervals_alone_would_not():
    """1.5% worse on every one of 32 windows: the separate intervals overlap, the paired one excludes 0."""
    a, b = (pd.DataFrame([measured(i, "X", s, (300, 200))]) for i, s in ((1, 1.0), (2, 1.015)))

    def cell(runs: pd.DataFrame) -> Cell:
        return Cell(float(runs["ppl_heldout"].iloc[0]), runs)

    paired = compare_cells(cell(a), cell(b), "ppl_heldout")
    assert paired.method.startswith("paired") and not paired.tie
    assert a["ppl_heldout_ci_high"].iloc[0] > b["ppl_heldout_ci_low"].iloc[0]
    other = b.assign(ppl_heldout_windows_hash="w2")  # other windows: no pairing, the intervals decide
    unpaired = compare_cells(cell(a), cell(other), "ppl_heldout")
    assert unpaired.method.startswith("unpaired") and unpaired.tie


def test_a_column_without_uncertainty_is_not_ranked():
    runs = pd.DataFrame([run(1, time_total_s=10.0), run(2, time_total_s=30.0)])
    marks = mark_column({i: Cell(float(r["time_total_s"]), runs.iloc[[i]]) for i, r in runs.iterrows()}, "time_total_s")
    assert marks == {}


def test_seeds_compare_by_their_spread():
    many = pd.DataFrame([run(i, avg_acc=v) for i, v in enumerate((0.70, 0.71, 0.69))])
    near = pd.DataFrame([run(i, avg_acc=v) for i, v in enumerate((0.695, 0.70, 0.705))])
    far = pd.DataFrame([run(i, avg_acc=v) for i, v in enumerate((0.50, 0.51, 0.49))])
    marks = mark_column({"a": Cell(0.70, many), "b": Cell(0.70, near), "c": Cell(0.50, far)}, "avg_acc")
    assert marks["a"] in (LEADER, TIED) and marks["b"] in (LEADER, TIED) and "c" not in marks


def test_a_sweep_reports_runs_table_bolds_the_leaders():
    rows = frame(
        measured(1, "A", 1.0, (300, 200)),
        measured(2, "B", 1.2, (300, 200)),
        measured(3, "C", 1.001, (300, 200), noise=0.03),
    )
    lines = runs_table(Group("s", "s", 3, rows, rows.iloc[0:0]))
    header = [c.strip() for c in lines[0].split("|")]
    assert "score_items_replaceme_capitals" not in header  # items are what comparisons read, not a metric
    column = header.index("ppl_heldout")
    ppl = {line.split("|")[1].strip(): line.split("|")[column].strip() for line in lines[2:]}
    assert ppl["A"].startswith("**") and ppl["C"].startswith("**") and not ppl["B"].startswith("**")
    assert "[" in ppl["B"]  # its interval
    accuracy = {line.split("|")[1].strip(): line.split("|")[header.index("avg_acc")].strip() for line in lines[2:]}
    assert all(cell.startswith("**") for cell in accuracy.values())  # the same items right: all tied


def test_a_task_scores_interval_stays_within_what_a_share_of_items_can_be():
    """A score of 1 item right in 400 with its lm-eval standard error: ±1.96 of it would reach below
    0 (-0.0024); the cell's interval stops at 0, and at 1 for a score near 1."""
    from replaceme_exp.reporting.paper_tables import run_interval

    se = float(np.sqrt(0.0025 * 0.9975 / 399))
    row = pd.Series(run(1, score_replaceme_capitals=0.0025, score_stderr_replaceme_capitals=se))
    assert run_interval(row, "score_replaceme_capitals") == (0.0, pytest.approx(0.0025 + 1.96 * se))
    row = pd.Series(run(1, score_replaceme_capitals=0.9975, score_stderr_replaceme_capitals=se))
    assert run_interval(row, "score_replaceme_capitals") == (pytest.approx(0.9975 - 1.96 * se), 1.0)
