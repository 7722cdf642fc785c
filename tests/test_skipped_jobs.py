"""A job skipped as finished before (its configuration already has a finished row) writes a small row
of its own under ``skips/``: its sweep's report lists it by the run that finished it (counts, runs
table, figures), and no reader of the store takes that row for a run, a finished row or a failure.
The sweep's summary reads a skipped job's JSON cells and keeps the sweep's failure exit code."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest
from helpers.config import compose_config
from helpers.jobs import SMOKE, run_cli
from omegaconf import OmegaConf

from replaceme_exp.reporting.dashboard import dashboard_rows
from replaceme_exp.reporting.overview import metric_panels, sweep_axes
from replaceme_exp.reporting.paper_settings import finished_runs, latest_failure
from replaceme_exp.reporting.render_paper import describe_rows
from replaceme_exp.reporting.report import build_groups, job_cell, write_report
from replaceme_exp.reporting.wandb_dashboard import skipped_note, sweep_rows
from replaceme_exp.results import ResultsStore
from replaceme_exp.results.cleaning import clean_failed, failed_removals
from replaceme_exp.results.row import skip_row
from replaceme_exp.results.store import latest_finished_per_config, latest_of_each_config
from replaceme_exp.runtime.sweep_summary import SweepSummary, alpha_notes, write_job_status


def run(run_id: str, config_hash: str, sweep_id: str, **values) -> dict:
    """A finished pruning row as a job writes it (held-out perplexity only, as eval=quick)."""
    row = dict(
        run_id=run_id, config_hash=config_hash, setting_hash=config_hash, status="finished", run_seq=1,
        started_at=f"2026-01-01T00:00:{len(run_id):02d}", sweep_id=sweep_id, sweep_name="sweep", job="prune",
        model="tiny_llama", eval="quick", calibration="pydoc", seed=42, n_prune=2, cuts=[[3, 5]],
        method="ReplaceMe LS", objective="ls", selection_metric="cosine", alpha=0.0, regularizer="none",
        ppl_heldout=40.0, ppl_heldout_baseline=21.0,
    )  # fmt: skip
    row.update(values)
    return row


def skipped(finished: dict, sweep_id: str, job_dir=None) -> dict:
    """The row a job of ``sweep_id`` writes when ``finished`` makes it skip."""
    return skip_row(finished, sweep_id, "sweep", str(job_dir) if job_dir else None)


# ---- the store and its readers ------------------------------------------------------------------


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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


# ---- the report ---------------------------------------------------------------------------------


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


@pytest.mark.unit
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


# ---- the sweep's summary ------------------------------------------------------------------------


@pytest.mark.unit
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


@pytest.mark.unit
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


# ---- a skipped job in process: its row, no W&B run, no CodeCarbon --------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_a_skipped_job_writes_its_row_and_starts_no_tracking(tmp_path, monkeypatch, caplog):
    from replaceme_exp.runtime import run_recorded

    tracked = ["tracking.wandb.mode=offline", "tracking.codecarbon.enabled=true", "save_model=false"]
    cfg = compose_config([*SMOKE, f"results_dir={tmp_path}", *tracked])
    earlier = lambda self, chash: run("earlier", chash, "s1")  # noqa: E731 - a finished row, no model run
    monkeypatch.setattr(ResultsStore, "finished_row", earlier)
    job_dir = tmp_path / "hydra" / "multirun" / "s2" / "0"
    row = run_recorded(cfg, sweep_id="s2", job_dir=job_dir, sweep_name="sweep")
    assert row["status"] == "skipped" and row["run_id"] == "earlier"
    (skip,) = ResultsStore(tmp_path).load_skips().to_dict("records")
    assert skip["finished_run_id"] == "earlier" and skip["config_hash"] == row["config_hash"]
    assert skip["sweep_id"] == "s2" and skip["job_dir"] == str(job_dir) and skip["run_id"] != "earlier"
    assert not job_dir.exists()  # no W&B run, no CodeCarbon files
    # a skips folder that cannot be written (here a file in its place: root writes anywhere) costs the
    # skip nothing: one warning
    shutil.rmtree(tmp_path / "skips")
    (tmp_path / "skips").write_text("not a folder")
    assert run_recorded(cfg, sweep_id="s3", job_dir=job_dir)["status"] == "skipped"
    assert "skipped job's row not written under" in caplog.text


# ---- end to end: run.py sweeps, then the report -------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sweep_that_skips_a_finished_job_reports_every_job(tmp_path):
    """``-m objective=ls alpha=20,abc`` (LS at 20 runs, abc fails), then the 2x2 sweep
    ``objective=ls,identity alpha=0,20`` (skips LS at 20, and identity at 20: its alpha-0
    configuration), then ``alpha=20,abc`` again with tracking on (all skipped or refused: it still
    exits non-zero), then the report."""
    first, _ = run_cli(["-m", *SMOKE, "objective=ls", "alpha=20,abc"], tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]
    grid, _ = run_cli(["-m", *SMOKE, "objective=ls,identity", "alpha=0,20"], tmp_path)
    assert grid.returncode == 0, grid.stderr[-3000:]
    assert "sweep: 2 finished, 2 skipped, 0 failed" in grid.stdout + grid.stderr
    tracked = ["tracking.wandb.mode=offline", "tracking.codecarbon.enabled=true"]
    again, _ = run_cli(["-m", *SMOKE, "objective=ls", "alpha=20,abc", *tracked], tmp_path)
    log = again.stdout + again.stderr
    assert again.returncode == 1, log[-3000:]  # the skipped job's JSON cells no longer break the summary
    assert "alpha=20 moved objective=ls's T" in log and "on_multirun_end raised" not in log

    store = ResultsStore(tmp_path)
    runs, skips = store.load(), store.load_skips()
    assert sorted(runs["status"]) == ["failed", "failed", "finished", "finished", "finished"]
    ls20 = runs[(runs["objective"] == "ls") & (runs["alpha"] == 20)].iloc[0]
    sweeps = sorted(runs["sweep_id"].unique())
    first_id, grid_id = ls20["sweep_id"], sweeps[1]
    again_id = skips[~skips["sweep_id"].isin([grid_id])]["sweep_id"].iloc[0]
    assert sorted(skips["sweep_id"]) == sorted([grid_id, grid_id, again_id])
    skipped_dir = skips[skips["sweep_id"] == again_id]["job_dir"].iloc[0]
    assert not any(p.name in ("wandb", "codecarbon") for p in (tmp_path / skipped_dir).iterdir())

    lines = write_report(tmp_path)
    assert any(f"(sweep {grid_id}): 2 finished, 2 skipped (finished before), 0 failed; read 4 rows" in x for x in lines)
    assert any(f"Sweep {again_id}: 0 finished, 1 skipped (finished before), 1 failed" in x for x in lines)
    page = (tmp_path / "report" / "sweeps" / f"{grid_id}.md").read_text()
    table = [line for line in page.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 1 + 3  # header, unpruned, LS 0, LS 20 (the first sweep's run), identity once
    (ls20_line,) = [line for line in table if line.startswith("| ReplaceMe LS | 20 |")]
    assert ls20_line.endswith(f"| skipped: run of sweep {first_id} | {ls20['run_id']} |")
    assert sum("| finished + 1 skipped |" in line for line in table) == 1  # identity at 20: its alpha-0 run
    assert (tmp_path / "report" / "sweeps" / grid_id / "ppl_heldout.png").is_file()
    index = (tmp_path / "report" / "index.md").read_text()
    assert f"(sweeps/{grid_id}.md) | 2 | 2 | 0 | 4 | 0 | method, alpha |" in index
    # the figure's data holds the skipped job's point: LS at alpha 20, the first sweep's perplexity
    grid = next(g for g in build_groups(runs, skips) if g.name == grid_id)
    (panel,) = metric_panels(grid.shown, "ppl_heldout", sweep_axes(grid.shown))
    point = panel.points[(panel.points["series"] == "ReplaceMe LS") & (panel.points["x"] == 20)]
    assert len(point) == 1 and math.isclose(point["y"].iloc[0], ls20["ppl_heldout"])
