"""CodeCarbon and W&B around real jobs (offline), and where their files go."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.config import ROOT, compose_config
from helpers.jobs import job_config
from helpers.tracking import TRACKED

from replaceme_exp.runtime import run_recorded
from replaceme_exp.tracking import StageEmissions


def tracked_config(tmp_path, *overrides):
    """The tiny job with the default tracking: W&B offline and CodeCarbon on."""
    return compose_config(TRACKED + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", *overrides])


@pytest.mark.slow
def test_a_job_logs_to_wandb_offline_and_measures_every_stage(tmp_path):
    before = set(ROOT.iterdir())
    cfg = tracked_config(tmp_path, "objective=cosine", "objective.epochs=2", "save_model=false")
    row = run_recorded(cfg, sweep_id="sweep-7", job_dir=tmp_path / "job", run_name="objective=cosine")
    assert row["status"] == "finished", row["error"]

    runs = list((tmp_path / "job" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and row["wandb_dir"].startswith(str(runs[0]))
    (log,) = runs[0].glob("run-*.wandb")
    data = log.read_bytes()
    for key in (b"ppl_heldout", b"cos_dist_after", b"energy_kwh", b"train/loss_", b"distance_profile", b"sweep-7"):
        assert key in data, key

    stages = {"load", "data", "capture", "estimate", "eval", "surgery"}
    assert all(row[f"energy_kwh_{s}"] > 0 and row[f"co2_kg_{s}"] > 0 for s in stages)
    assert row["energy_kwh"] > 0 and row["co2_kg"] > 0
    assert row["energy_kwh"] >= sum(row[f"energy_kwh_{s}"] for s in stages) * (1 - 1e-9)
    assert (tmp_path / "job" / "codecarbon" / "emissions.csv").is_file()
    assert set(ROOT.iterdir()) == before  # nothing written into the working directory


@pytest.mark.slow
def test_disabled_tracking_writes_nothing_and_leaves_energy_missing(tmp_path):
    row = run_recorded(job_config(tmp_path, "save_model=false"), job_dir=tmp_path / "job")
    assert row["status"] == "finished" and row["wandb_dir"] is None
    assert "energy_kwh" not in row
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").iterdir())
    assert StageEmissions(enabled=False).columns() == {}


def test_a_failed_job_is_logged_too(tmp_path, monkeypatch):
    import replaceme_exp.pipeline.job as pipeline_job

    def failing_load(*args, **kwargs):  # a failure after the run started (bad values are refused before)
        raise RuntimeError("injected failure while loading")

    monkeypatch.setattr(pipeline_job, "load_model", failing_load)
    cfg = tracked_config(tmp_path, "tracking.codecarbon.enabled=false")
    row = run_recorded(cfg, job_dir=tmp_path / "job", raise_on_failure=False)
    assert row["status"] == "failed"
    (log,) = Path(tmp_path / "job" / "wandb").glob("offline-run-*/run-*.wandb")
    assert b"failed" in log.read_bytes()


@pytest.mark.slow
def test_a_tracked_job_says_how_its_energy_was_obtained(tmp_path):
    """The row of a tiny job with CodeCarbon on (offline): tracking mode, the grid, and per device
    whether its power was measured or estimated (CodeCarbon never measures RAM: always estimated)."""
    cfg = job_config(tmp_path, "tracking.codecarbon.enabled=true", "tracking.codecarbon.region=washington")
    row = run_recorded(cfg, job_dir=tmp_path / "job")
    assert row["status"] == "finished", row["error"]
    assert row["energy_tracking_mode"] == "process" and row["energy_region"] == "washington"
    assert row["energy_country_iso_code"] == "USA"
    power = row["energy_power"]
    assert {"cpu", "ram"} <= set(power) and all(v.startswith(("measured", "estimated")) for v in power.values())
    assert power["ram"] == "estimated: from this process's resident memory"
    assert row["energy_estimated"] is True and row["energy_kwh"] > 0
    import pandas as pd

    csv = pd.read_csv(tmp_path / "job" / "codecarbon" / "emissions.csv")
    assert set(csv["tracking_mode"]) == {"process"} and set(csv["region"]) == {"washington"}


@pytest.mark.slow
def test_codecarbon_writes_its_files_when_it_stops_and_imports_no_network_output(tmp_path):
    """The tracker is made without an output (CodeCarbon would import its HTTP, Prometheus and
    Logfire outputs: about 0.6 s of every job's start-up); its stop writes the job's total
    (emissions.csv) and one line per stage (emissions_<experiment>_<run>.csv), as before."""
    import subprocess
    import sys

    code = f"""
import sys
from replaceme_exp.tracking import StageEmissions
emissions = StageEmissions(enabled=True, output_dir={str(tmp_path / "cc")!r})
with emissions.stage("load"):
    sum(i * i for i in range(200_000))
with emissions.stage("capture"):
    sum(i * i for i in range(200_000))
outputs = sorted(m for m in sys.modules if m.startswith("codecarbon.output_methods."))
emissions.close()
print(outputs)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = done.stdout.strip().splitlines()[-1]
    assert not any(name in imported for name in ("http", "prometheus", "logfire")), imported
    import pandas as pd

    total = pd.read_csv(tmp_path / "cc" / "emissions.csv")
    assert len(total) == 1 and total["energy_consumed"].iloc[0] > 0
    (tasks,) = (tmp_path / "cc").glob("emissions_*_*.csv")
    stages = pd.read_csv(tasks)
    assert list(stages["task_name"]) == ["load", "capture"] and (stages["energy_consumed"] > 0).all()


def test_a_codecarbon_without_output_handlers_still_stops_and_keeps_the_energy(tmp_path, caplog):
    """Attaching the file output at stop uses CodeCarbon's output-handler list; a CodeCarbon whose
    handlers are not a list gets a warning that its CSV files are not written, and its tracker
    still stops with the stages' energy kept."""
    emissions = StageEmissions(enabled=True, output_dir=tmp_path / "cc")
    with emissions.stage("load"):
        sum(i * i for i in range(100_000))
    emissions.tracker._output_handlers = ()  # not a list this code can add to
    with caplog.at_level("WARNING", logger="replaceme_exp.tracking.emissions"):
        emissions.close()
    assert "CSV files not written" in caplog.text and "did not stop cleanly" not in caplog.text
    assert emissions.tracker._start_time is None  # stopped
    assert emissions.columns()["energy_kwh_load"] > 0 and not (tmp_path / "cc" / "emissions.csv").exists()
