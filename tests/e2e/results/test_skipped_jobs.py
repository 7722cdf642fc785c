"""A job skipped as finished before (its configuration already has a finished row) writes a small row
of its own under ``skips/``: its sweep's report lists it by the run that finished it (counts, runs
table, figures), and no reader of the store takes that row for a run, a finished row or a failure.
The sweep's summary reads a skipped job's JSON cells and keeps the sweep's failure exit code."""

from __future__ import annotations

import math

import pytest
from helpers.jobs import SMOKE, run_cli

from replaceme_exp.reporting.overview import metric_panels, sweep_axes
from replaceme_exp.reporting.report import build_groups, write_report
from replaceme_exp.results import ResultsStore


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
