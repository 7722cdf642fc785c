"""A job skipped as finished before (its configuration already has a finished row) writes a small row
of its own under ``skips/``: its sweep's report lists it by the run that finished it (counts, runs
table, figures), and no reader of the store takes that row for a run, a finished row or a failure.
The sweep's summary reads a skipped job's JSON cells and keeps the sweep's failure exit code."""

from __future__ import annotations

import shutil

import pytest
from helpers.config import compose_config
from helpers.jobs import SMOKE
from helpers.skipped_jobs import run

from replaceme_exp.results import ResultsStore


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
