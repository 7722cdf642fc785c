"""``make report``: one overview per sweep (the swept settings as axes, the unpruned model as a line,
standard errors as bars, grouped bars for categories, numbers to their precision), failed runs out of
the way, and ``make clean-failed``. Unit tests on rows written through the store API; one e2e test on a
real tiny sweep of two presets through run.py and make."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

from replaceme_exp.reporting.overview import draw, metric_panels, stderrs, sweep_axes
from replaceme_exp.reporting.precision import error_decimals, format_measure
from replaceme_exp.reporting.report import build_groups, split_runs, varying_settings, write_report
from replaceme_exp.results import ResultsStore
from replaceme_exp.results.cleaning import clean_failed, failed_removals


def finished_row(i: int, **values) -> dict:
    """A finished pruning row as a job writes its columns (a two-task lm-eval suite with stderrs)."""
    row = dict(
        run_id=f"r{i}", config_hash=f"h{i}", status="finished", started_at=f"2026-01-01T00:00:{i:02d}",
        sweep_id="s1", sweep_name="experiment=replaceme_ls,uidl_baseline", job="prune", model="tiny_llama",
        eval="offline", calibration="pydoc", seed=42, n_prune=2, cuts=[[3, 5]], method="ReplaceMe LS",
        objective="ls", solver=None, selection_metric="cosine", alpha=0.0, regularizer="none",
        alpha_scale="token_sum", ppl_heldout=40.0 + i, ppl_heldout_baseline=21.2137,
        eval_metrics={"piqa": "acc_norm", "boolq": "acc"}, score_piqa=0.5, score_stderr_piqa=0.066,
        score_boolq=0.45, score_stderr_boolq=0.067, baseline_score_piqa=0.6, baseline_score_stderr_piqa=0.065,
        baseline_score_boolq=0.5, baseline_score_stderr_boolq=0.067, avg_acc=0.475, avg_acc_baseline=0.55,
    )  # fmt: skip
    row.update(values)
    return row


def stored(tmp_path, *rows: dict) -> pd.DataFrame:
    """``rows`` written to a results store under ``tmp_path`` and read back as the report reads them."""
    store = ResultsStore(tmp_path)
    for row in rows:
        store.write(row)
    return store.load()


def method_alpha_sweep(tmp_path) -> pd.DataFrame:
    """``-m experiment=replaceme_ls,uidl_baseline alpha=0,10`` as rows: identity ignores alpha (one
    configuration), and the derived columns (objective, solver, selection, regularizer, alpha_scale)
    follow the two swept ones; seeds 1 and 2 of every setting."""
    rows, i = [], 0
    for method, alpha in (("ReplaceMe LS", 0.0), ("ReplaceMe LS", 10.0), ("UIDL", 0.0)):
        for seed in (1, 2):
            i += 1
            uidl = method == "UIDL"
            rows.append(
                finished_row(
                    i,
                    method=method,
                    alpha=alpha,
                    seed=seed,
                    objective="identity" if uidl else "ls",
                    selection_metric="angular_last" if uidl else "cosine",
                    regularizer="l2" if alpha else "none",
                    alpha_scale=None if uidl else "token_sum",
                    avg_acc=0.4 + 0.01 * i,
                )  # fmt: skip
            )
    return stored(tmp_path, *rows)


def test_axes_are_the_swept_settings_not_the_columns_derived_from_them_nor_the_seed(tmp_path):
    runs = method_alpha_sweep(tmp_path)
    assert sweep_axes(runs) == ["method", "alpha"]
    # explicit cuts are an axis, labelled [a,b); selected cuts (a result) never are
    explicit = stored(
        tmp_path / "cuts",
        finished_row(1, cuts=[[1, 3]], selection_metric=None),
        finished_row(2, cuts=[[2, 4]], selection_metric=None),
    )
    assert sweep_axes(explicit) == ["cuts"]
    panel = metric_panels(explicit, "ppl_heldout", ["cuts"])[0]
    assert panel.x_order == ["[1,3)", "[2,4)"] and not panel.numeric_x
    selected = stored(tmp_path / "selected", finished_row(1, cuts=[[1, 3]]), finished_row(2, cuts=[[2, 4]]))
    assert sweep_axes(selected) == []
    # calibration draws are replicates, as seeds: averaged into one point, never an axis
    draws = stored(
        tmp_path / "draws",
        *(finished_row(i, calibration_draw=i, calibration_sample_seed=100 + i, cuts=[[i, i + 2]]) for i in range(3)),
    )
    assert sweep_axes(draws) == []


def test_numeric_axis_draws_lines_with_error_bars_and_the_unpruned_line(tmp_path):
    runs = method_alpha_sweep(tmp_path)
    panels = metric_panels(runs, "avg_acc", sweep_axes(runs))
    (panel,) = panels
    assert panel.numeric_x and panel.xlabel == "alpha" and panel.series_label == "method"
    # seeds averaged: two runs a point, its error the standard error of their mean
    ls0 = panel.points[(panel.points["series"] == "ReplaceMe LS") & (panel.points["x"] == 0)].iloc[0]
    assert ls0["n"] == 2 and ls0["y"] == pytest.approx(0.415) and ls0["yerr"] == pytest.approx(0.005)
    # the unpruned model: one value for the panel, with the stderr of its tasks: sqrt(.065^2+.067^2)/2
    assert panel.baseline.iloc[0]["y"] == 0.55 and panel.baseline.iloc[0]["x"] is None
    assert panel.baseline.iloc[0]["yerr"] == pytest.approx(math.hypot(0.065, 0.067) / 2)
    figure = draw(panels, tmp_path / "avg_acc.png")
    ax = figure.axes[0]
    unpruned = [line for line in ax.get_lines() if line.get_label().startswith("unpruned")]
    assert len(unpruned) == 1 and unpruned[0].get_ydata()[0] == 0.55 and unpruned[0].get_linestyle() == "--"
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 2  # one line per method
    assert (tmp_path / "avg_acc.png").stat().st_size > 10_000


def test_stderr_bars_only_where_a_standard_error_is_recorded(tmp_path):
    one_run = stored(tmp_path, finished_row(1), finished_row(2, alpha=10.0, regularizer="l2"))
    assert list(stderrs(one_run, "avg_acc")) == pytest.approx([math.hypot(0.066, 0.067) / 2] * 2)
    assert list(stderrs(one_run, "score_piqa")) == [0.066, 0.066]
    assert stderrs(one_run, "ppl_heldout").isna().all()  # a held-out perplexity has none: none is invented
    (ppl,) = metric_panels(one_run, "ppl_heldout", ["alpha"])
    assert ppl.points["yerr"].isna().all() and ppl.points["error"].isna().all()
    (acc,) = metric_panels(one_run, "score_piqa", ["alpha"])
    assert list(acc.points["yerr"]) == [0.066, 0.066] and set(acc.points["error"]) == {"recorded"}


def test_categorical_settings_are_grouped_bars(tmp_path):
    rows = [
        finished_row(i, method=m, calibration=c, avg_acc=0.4 + 0.01 * i)
        for i, (m, c) in enumerate([(m, c) for m in ("ReplaceMe LS", "UIDL") for c in ("pydoc", "self_generated")])
    ]
    runs = stored(tmp_path, *rows)
    assert sweep_axes(runs) == ["method", "calibration"]
    panels = metric_panels(runs, "avg_acc", sweep_axes(runs))
    assert not panels[0].numeric_x and panels[0].x_order == ["ReplaceMe LS", "UIDL"]
    ax = draw(panels, tmp_path / "bars.png").axes[0]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(bars) == 2 and all(len(b) == 2 for b in bars)  # 2 calibrations x 2 methods, side by side
    assert bars[0][0].get_x() != bars[1][0].get_x()
    assert not [line for line in ax.get_lines() if line.get_marker() == "o"]  # no line joins the categories
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ReplaceMe LS", "UIDL"]


def test_numbers_are_rounded_to_the_digits_their_standard_error_supports():
    assert format_measure(0.4821, 0.0667) == "0.48 ± 0.07"  # 56 items: not 0.4821
    assert format_measure(0.4821, 0.0123) == "0.482 ± 0.012"  # leading digits 12 < 35: two
    assert format_measure(123.4, 15.2) == "123 ± 15"
    assert format_measure(21.2137) == "21.21" and format_measure(None) == "—" and format_measure(3.0) == "3"
    assert error_decimals(0.0667) == 2 and error_decimals(0.34) == 2 and error_decimals(0.5) == 1
    # against an independent rule: the rounded value's last digit is the error's last digit
    for value, error in [(0.63, 0.0096), (5.4321, 0.25), (1234.5, 351.0)]:
        text_value, text_error = format_measure(value, error).split(" ± ")
        assert len(text_value.partition(".")[2]) == len(text_error.partition(".")[2])
        assert abs(float(text_value) - value) <= 0.5 * 10 ** -error_decimals(error) + 1e-12


@pytest.mark.slow
def test_failed_runs_are_hidden_unless_asked_for_and_a_typo_sweep_is_left_out(tmp_path):
    store = ResultsStore(tmp_path)
    for row in (finished_row(1), finished_row(2, alpha=10.0, regularizer="l2")):
        store.write(row)
    store.write(dict(run_id="f1", config_hash="h9", sweep_id="s1", status="failed", error="JobInterrupted: SIGTERM"))
    typo = dict(run_id="t1", config_hash="invalid-1", sweep_id="typo", status="failed", error="ConfigError: alpah")
    store.write(typo)
    lines = write_report(tmp_path)
    page = (tmp_path / "report" / "sweeps" / "s1.md").read_text()
    assert "1 failed run hidden" in page and "f1" not in page and "make clean-failed" in page
    assert not (tmp_path / "report" / "sweeps" / "typo.md").exists()
    assert any("Sweep typo" in line and "hidden" in line for line in lines)
    index = (tmp_path / "report" / "index.md").read_text()
    assert "typo" not in index.split("\n\n")[2] and "1 sweep(s) without a finished run are hidden" in index
    assert sorted(p.name for p in (tmp_path / "report" / "sweeps" / "s1").glob("*.png")) == [
        "avg_acc.png", "ppl_heldout.png", "tasks.png"
    ]  # fmt: skip
    assert not list((tmp_path / "report").glob("all/*.png"))  # the all-runs page is a table
    write_report(tmp_path, show_failed=True)
    page = (tmp_path / "report" / "sweeps" / "s1.md").read_text()
    assert "## Failed runs (1)" in page and "- `f1`" in page and "JobInterrupted: SIGTERM" in page
    assert (tmp_path / "report" / "sweeps" / "typo.md").exists()
    # the runs table: the unpruned row first, numbers to their precision
    table = [line for line in page.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| alpha | cuts |") and table[1].startswith("| unpruned |")
    assert "| 21.21 |" in table[1] and "0.55 ± 0.05" in table[1]
    plain = table[2].replace("**", "")  # bold: a column's leaders (tests/unit/reporting/test_ties.py)
    assert "| 0.47 ± 0.05 |" in plain and "| 0.50 ± 0.07 |" in plain  # avg_acc: sqrt(.066^2+.067^2)/2


def test_clean_failed_lists_by_default_and_removes_only_failed_runs_with_confirm(tmp_path):
    store = ResultsStore(tmp_path)
    done = finished_row(1, job_dir=str(tmp_path / "jobs" / "r1"))
    rerun = dict(run_id="r1b", config_hash="h1", status="failed", error="x", job_dir=str(tmp_path / "jobs" / "r1b"))
    never = dict(run_id="f2", config_hash="h2", status="failed", error="x", job_dir=str(tmp_path / "jobs" / "f2"))
    outside = dict(run_id="f3", config_hash="h3", status="failed", error="x", job_dir=str(tmp_path.parent))
    for row in (done, rerun, never, outside):
        store.write(row)
        if row["job_dir"] != str(tmp_path.parent):
            (tmp_path / "jobs" / row["run_id"]).mkdir(parents=True)
    for config_hash in ("h1", "h2"):
        (tmp_path / "models" / config_hash).mkdir(parents=True)
        (tmp_path / "models" / config_hash / "model.safetensors").write_text("weights")
    planned = {str(r.path.relative_to(tmp_path)) for r in failed_removals(tmp_path)}
    assert planned == {
        "runs/h1/r1b.parquet", "jobs/r1b", "runs/h2/f2.parquet", "jobs/f2", "models/h2", "runs/h3/f3.parquet"
    }  # fmt: skip
    lines = clean_failed(tmp_path)
    assert lines[-1].startswith("dry run: 6 path(s) would be removed") and len(store.load()) == 4
    assert (tmp_path / "models" / "h2").is_dir()
    lines = clean_failed(tmp_path, confirm=True)
    assert lines[-1] == "removed 6 path(s)"
    left = store.load()
    assert list(left["run_id"]) == ["r1"] and (tmp_path / "models" / "h1" / "model.safetensors").is_file()
    assert (tmp_path / "jobs" / "r1").is_dir() and not (tmp_path / "jobs" / "f2").exists()
    assert not (tmp_path / "runs" / "h2").exists() and tmp_path.parent.is_dir()
    assert clean_failed(tmp_path) == [f"no failed run under {tmp_path / 'runs'}: nothing to remove"]


def test_rows_not_shown_are_counted_with_their_reason():
    rows = pd.DataFrame(
        [
            {"run_id": "a", "config_hash": "c1", "status": "failed", "started_at": "1", "alpha": 0.0},
            {"run_id": "b", "config_hash": "c1", "status": "finished", "started_at": "2", "alpha": 0.0},
            {"run_id": "c", "config_hash": "c1", "status": "finished", "started_at": "3", "alpha": 0.0},
            {"run_id": "d", "config_hash": "c2", "status": "failed", "started_at": "4", "alpha": 1.0},
            {"run_id": "e", "config_hash": "c2", "status": "failed", "started_at": "5", "alpha": 1.0},
            {"run_id": "f", "config_hash": "c3", "status": "running", "started_at": "6", "alpha": 2.0},
        ]
    )
    group = split_runs(rows, "all", "All runs")
    assert list(group.shown["run_id"]) == ["c"] and list(group.failed["run_id"]) == ["e"]
    assert group.not_shown == {
        "older finished runs of a configuration shown by its latest run": 1,
        "failed runs of a configuration that also finished": 1,
        "older failures of a configuration listed by its latest failure": 1,
        "rows with status=running (unfinished: killed or still running)": 1,
    }
    assert group.counts().startswith("1 finished, 0 skipped (finished before), 1 failed; read 6 rows, 4 not shown (")


def test_varying_settings_and_groups_by_sweep():
    rows = pd.DataFrame(
        [
            {"run_id": "a", "config_hash": "1", "status": "finished", "sweep_id": "s1", "alpha": 0.0, "seed": 1,
             "model": "m", "objective": "ls"},
            {"run_id": "b", "config_hash": "2", "status": "finished", "sweep_id": "s1", "alpha": 0, "seed": 2,
             "model": "m", "objective": "ls"},
            {"run_id": "c", "config_hash": "3", "status": "finished", "sweep_id": None, "alpha": 10.0, "seed": 1,
             "model": "m", "objective": None},
        ]
    )  # fmt: skip
    assert varying_settings(rows) == ["objective", "alpha", "seed"]
    assert varying_settings(rows.iloc[:2]) == ["seed"]  # 0 and 0.0 are one value
    groups = build_groups(rows)
    assert [g.name for g in groups] == ["all", "no_sweep", "s1"]
    assert [len(g.shown) for g in groups] == [3, 1, 2]
    assert [g.title for g in groups] == ["All runs", "Sweep no_sweep", "Sweep s1"]  # only seeds vary in s1
    by_alpha = rows.assign(sweep_id="s3", sweep_name="sweep")
    assert build_groups(by_alpha)[1].title == "alpha (sweep s3)"  # a sweep of no preset: titled by what varies
    # a store from before sweeps were named as a whole: each job named for its own preset
    old = rows.assign(sweep_id="s2", sweep_name=["experiment/replaceme_ls", "experiment/uidl_baseline", None])
    assert build_groups(old)[1].title == "experiment=replaceme_ls,uidl_baseline (sweep s2)"
    assert json.dumps(sweep_axes(rows)) == '["alpha"]'  # objective follows alpha here: one direction, not two
