"""A job skipped as finished before (its configuration already has a finished row) writes a small row
of its own under ``skips/``: its sweep's report lists it by the run that finished it (counts, runs
table, figures), and no reader of the store takes that row for a run, a finished row or a failure.
The sweep's summary reads a skipped job's JSON cells and keeps the sweep's failure exit code."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers.skipped_jobs import run, skipped
from omegaconf import OmegaConf

from replaceme_exp.reporting.dashboard import dashboard_rows
from replaceme_exp.reporting.overview import metric_panels, sweep_axes
from replaceme_exp.reporting.paper_settings import finished_runs, latest_failure
from replaceme_exp.reporting.render_paper import describe_rows
from replaceme_exp.reporting.report import build_groups, job_cell, write_report
from replaceme_exp.reporting.wandb_dashboard import skipped_note, sweep_rows
from replaceme_exp.results import ResultsStore
from replaceme_exp.results.cleaning import clean_failed, failed_removals
from replaceme_exp.results.store import latest_finished_per_config, latest_of_each_config
from replaceme_exp.runtime.sweep_summary import SweepSummary, alpha_notes, write_job_status


def test_a_skipped_jobs_row_is_stored_apart_and_the_store_never_takes_it_for_a_run(tmp_path):
    store = ResultsStore(tmp_path)
    done = run("r1", "h1", "s1")
    store.write(done)
    row = skipped(done, "s2")
    path = store.write(row)
    assert path == tmp_path / "skips" / "h1" / f"{row['run_id']}.parquet"
    # a skipped job whose finished row was removed since: its configuration has no run at all
    store.write(skipped(run("gone", "h2", "s1"), "s2"))
    assert list(store.load()["run_id"]) == ["r1"]
    assert list(store.load(latest_per_config=True)["run_id"]) == ["r1"]
    assert store.finished_row("h1")["run_id"] == "r1" and store.finished_row("h2") is None
    assert store.next_run_seq("h1") == 2 and store.next_run_seq("h2") == 1
    skips = store.load_skips()
    assert sorted(skips["finished_run_id"]) == ["gone", "r1"] and set(skips["status"]) == {"skipped"}
    assert set(skips["sweep_id"]) == {"s2"} and set(skips["sweep_group"]) == {"sweep s2"}


def test_the_latest_run_of_a_configuration_is_never_a_skipped_jobs_row():
    """A table that holds skipped jobs' rows (read together by some caller): a skipped job is no run,
    the latest of no configuration, not even of one whose finished run is gone."""
    table = pd.DataFrame(
        [
            run("r1", "h1", "s1", started_at="1"),
            {**skipped(run("r1", "h1", "s1"), "s2"), "started_at": "2"},
            {**skipped(run("gone", "h2", "s1"), "s2"), "started_at": "3"},
        ]
    )
    assert list(latest_of_each_config(table)["run_id"]) == ["r1"]
    assert list(latest_finished_per_config(table)["run_id"]) == ["r1"]


def test_clean_failed_leaves_skipped_jobs_rows_and_their_job_folders(tmp_path):
    store = ResultsStore(tmp_path)
    done = run("r1", "h1", "s1", job_dir=str(tmp_path / "jobs" / "r1"))
    failed = dict(run_id="f2", config_hash="h2", status="failed", error="x", job_dir=str(tmp_path / "jobs" / "f2"))
    skip = skipped(done, "s2", tmp_path / "jobs" / "k1")
    for row, folder in ((done, "r1"), (failed, "f2"), (skip, "k1")):
        store.write(row)
        (tmp_path / "jobs" / folder).mkdir(parents=True)
    planned = {str(r.path.relative_to(tmp_path)) for r in failed_removals(tmp_path)}
    assert planned == {"runs/h2/f2.parquet", "jobs/f2"}
    assert clean_failed(tmp_path, confirm=True)[-1] == "removed 2 path(s)"
    assert len(store.load_skips()) == 1 and (tmp_path / "jobs" / "k1").is_dir()


def test_paper_tables_and_dashboards_read_runs_not_skipped_jobs(tmp_path):
    store = ResultsStore(tmp_path)
    done = run("r1", "h1", "s1")
    store.write(done)
    store.write(skipped(done, "s2"))
    store.write(skipped(run("gone", "h2", "s1"), "s2"))
    runs = store.load(latest_per_config=True)
    assert describe_rows(runs, tmp_path) == f"read 1 rows (1 finished, 0 failed) from {tmp_path}"
    assert list(finished_runs(runs)["run_id"]) == ["r1"] and latest_failure(runs, {}) is None
    assert [r["run_id"] for r in dashboard_rows(store, tmp_path)] == ["r1"]
    assert list(sweep_rows(tmp_path, "s1")["run_id"]) == ["r1"]
    # a sweep whose every job was skipped has no W&B run: the workspace command says where they are
    with pytest.raises(SystemExit, match="2 job\\(s\\) of the sweep were skipped as finished before .* sweeps s1"):
        sweep_rows(tmp_path, "s2")
    assert skipped_note(tmp_path, "s1") is None


def sweeps_with_skips(tmp_path) -> ResultsStore:
    """Sweep s1 ran LS at alpha 0 and 10; sweep s2 (objective=ls,identity alpha=0,20 and a failure)
    ran LS at 20 and identity at 0, skipped LS at 0 (s1's run) and identity at 20 (its own identity
    run: identity takes no alpha), and one job whose finished run was removed since; sweep s3 only
    skipped (LS at 10)."""
    store = ResultsStore(tmp_path)
    ls0, ls10 = run("a1", "h1", "s1", ppl_heldout=41.0), run("a2", "h2", "s1", alpha=10.0, ppl_heldout=43.0)
    ls20 = run("b1", "h3", "s2", alpha=20.0, ppl_heldout=45.0)
    identity = run("b2", "h4", "s2", method="UIDL", objective="identity", selection_metric="angular_last",
                   ppl_heldout=90.0)  # fmt: skip
    for row in (ls0, ls10, ls20, identity):
        store.write(row)
    store.write(dict(run_id="f1", config_hash="h5", sweep_id="s2", status="failed", error="ConfigError: alpha"))
    for finished, sweep in ((ls0, "s2"), (identity, "s2"), (run("gone", "h6", "s0"), "s2"), (ls10, "s3")):
        store.write(skipped(finished, sweep))
    return store


def test_a_sweeps_page_lists_its_skipped_jobs_by_the_runs_that_finished_them(tmp_path):
    store = sweeps_with_skips(tmp_path)
    groups = {g.name: g for g in build_groups(store.load(), store.load_skips())}
    s2 = groups["s2"]
    assert s2.counts() == (
        "2 finished, 3 skipped (finished before), 1 failed; read 6 rows, "
        "1 not shown (1 skipped jobs whose finished run is no longer in the store)"
    )
    shown = s2.shown.set_index("run_id")
    assert sorted(shown.index) == ["a1", "b1", "b2"]  # s1's run for the skipped job; identity once
    assert [job_cell(shown.loc[r]) for r in ("a1", "b1", "b2")] == [
        "skipped: run of sweep s1", "finished", "finished + 1 skipped"
    ]  # fmt: skip
    # the skipped job's point is in the figure: LS at alpha 0, from s1's run
    (panel,) = metric_panels(s2.shown, "ppl_heldout", sweep_axes(s2.shown))
    points = {(p.series, p.x): p.y for p in panel.points.itertuples()}
    assert points == {("ReplaceMe LS", 0): 41.0, ("ReplaceMe LS", 20): 45.0, ("UIDL", 0): 90.0}
    assert groups["s3"].counts() == "0 finished, 1 skipped (finished before), 0 failed; read 1 rows"
    assert list(groups["s3"].shown["run_id"]) == ["a2"]
    everything = groups["all"]  # every finished run once; the skipped jobs counted
    assert sorted(everything.shown["run_id"]) == ["a1", "a2", "b1", "b2"] and everything.n_skipped == 4

    lines = write_report(tmp_path)
    assert "and 4 skipped jobs' rows from 4 files under" in lines[0]
    page = (tmp_path / "report" / "sweeps" / "s2.md").read_text()
    table = [line for line in page.splitlines() if line.startswith("| ")]
    assert table[0] == "| method | alpha | cuts | ppl_heldout | job | run_id |"
    assert table[2:] == [
        "| ReplaceMe LS | 0 | [3,5) | 41 | skipped: run of sweep s1 | a1 |",
        "| ReplaceMe LS | 20 | [3,5) | 45 | finished | b1 |",
        "| UIDL | 0 | [3,5) | 90 | finished + 1 skipped | b2 |",
    ]
    assert "## Runs (3)" in page and "Swept: method (ReplaceMe LS, UIDL); alpha (0, 20)." in page
    index = (tmp_path / "report" / "index.md").read_text()
    assert "| sweep | finished | skipped (finished before) | failed | rows read | not shown | swept |" in index
    assert "(sweeps/s2.md) | 2 | 3 | 1 | 6 | 1 | method, alpha |" in index
    assert "(sweeps/s3.md) | 0 | 1 | 0 | 1 | 0 | — |" in index  # every job skipped: listed, not hidden
    assert "| job |" not in (tmp_path / "report" / "all.md").read_text()


def test_the_alpha_notes_read_a_skipped_jobs_cells_as_parquet_gives_them(tmp_path):
    """A skipped job's status holds its finished row read back from parquet: per-cut cells as JSON text."""
    store = ResultsStore(tmp_path)
    store.write(run("r1", "h1", "s1", alpha=10.0, alpha_effect={"3-5": 0.25}, gram_mean_eigenvalue={"3-5": 0.01},
                    dtype="float32"))  # fmt: skip
    row = {**store.finished_row("h1"), "status": "skipped"}
    assert isinstance(row["alpha_effect"], str)
    write_job_status(tmp_path / "0", row, "alpha=10", 10)
    status = json.loads((tmp_path / "0" / "replaceme_status.json").read_text())
    (line,) = alpha_notes([status])
    moved = "alpha=10 moved objective=ls's T by 2.5e-01 relative to alpha=0"
    assert line == f"{moved} (measured; mean eigenvalue of M^T M: 0.01)"


def test_a_sweep_with_a_failed_job_exits_non_zero_even_when_its_summary_table_fails(tmp_path, caplog):
    write_job_status(tmp_path / "0", {"status": "failed", "error": "ConfigError: alpha='abc'"}, "alpha=abc")
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "replaceme_status.json").write_text(json.dumps({"status": "finished"}))  # no overrides
    for job in ("0", "1"):
        (tmp_path / job / ".hydra").mkdir()
    with pytest.raises(SystemExit) as stopped:
        SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert stopped.value.code == 1
    assert "the sweep's summary table failed" in caplog.text and "1 of 2 jobs failed" in caplog.text
