"""CodeCarbon and W&B around real jobs (offline), and where their files go."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.config import ROOT, compose_config
from helpers.jobs import SMOKE, job_config

from replaceme_exp.runtime import run_recorded
from replaceme_exp.tracking import StageEmissions

TRACKED = [*SMOKE, "tracking.wandb.mode=offline", "tracking.codecarbon.enabled=true"]  # the default tracking


def tracked_config(tmp_path, *overrides):
    """The tiny job with the default tracking: W&B offline and CodeCarbon on."""
    return compose_config(TRACKED + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", *overrides])


@pytest.mark.integration
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


@pytest.mark.integration
def test_disabled_tracking_writes_nothing_and_leaves_energy_missing(tmp_path):
    row = run_recorded(job_config(tmp_path, "save_model=false"), job_dir=tmp_path / "job")
    assert row["status"] == "finished" and row["wandb_dir"] is None
    assert "energy_kwh" not in row
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").iterdir())
    assert StageEmissions(enabled=False).columns() == {}


@pytest.mark.integration
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


@pytest.mark.e2e
@pytest.mark.slow
def test_each_job_of_a_sweep_is_its_own_wandb_run_in_its_hydra_job_dir(tmp_path):
    from helpers.jobs import run_cli

    proc, _ = run_cli(["-m", *TRACKED, "tracking.codecarbon.enabled=false", "seed=1,2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted((tmp_path / "hydra" / "multirun").glob("*/*/wandb/offline-run-*"))
    assert [r.parts[-3] for r in runs] == ["0", "1"]  # the Hydra job subdirectories
    names = [next(r.glob("run-*.wandb")).read_bytes() for r in runs]
    assert all(b"seed=1" in n or b"seed=2" in n for n in names)


@pytest.mark.integration
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


@pytest.mark.unit
def test_power_sources_name_measured_and_estimated_devices():
    from replaceme_exp.tracking.emissions import power_sources

    class CPU:
        def __init__(self, mode, tdp=8):
            self._mode, self._tdp = mode, tdp

    class RAM:
        _force_ram_power = None

    class GPU:
        pass

    rapl = power_sources([CPU("intel_rapl"), RAM(), GPU()], "process")
    assert rapl["cpu"] == "measured: RAPL (the whole package, not this process)"
    assert rapl["gpu"].startswith("measured") and rapl["ram"].startswith("estimated")
    load = power_sources([CPU("cpu_load", 45)], "machine")
    assert load == {"cpu": "estimated: TDP 45 W x the machine's CPU load"}
    assert power_sources([CPU("cpu_load", 45)], "process")["cpu"] == "estimated: TDP 45 W x this process's CPU time"
    assert power_sources([CPU("constant", 85)], "machine")["cpu"] == "estimated: TDP 85 W constant"


@pytest.mark.unit
def test_an_unknown_region_is_refused_in_one_line():
    from replaceme_exp.errors import ConfigError
    from replaceme_exp.tracking.emissions import check_region

    check_region("USA", "washington")
    check_region("USA", None)
    with pytest.raises(ConfigError, match="tracking.codecarbon.region.*nowhere.*not a region of USA"):
        check_region("USA", "nowhere")
    with pytest.raises(ConfigError, match="no regional grid data for FRA"):
        check_region("FRA", "bretagne")


@pytest.mark.unit
def test_estimated_energy_is_marked_in_table_cells_and_report_rows():
    import pandas as pd
    from helpers.tables import run

    from replaceme_exp.reporting.energy_marks import MARK
    from replaceme_exp.reporting.paper_tables import Column, Row, TableSpec, build_table, to_markdown
    from replaceme_exp.reporting.report import Group, runs_table

    spec = TableSpec("cost", "Cost.", where={}, rows=[Row("ReplaceMe", {})], columns=[Column("CO2", "co2_kg")])
    estimated = pd.DataFrame([run(1, co2_kg=0.12, energy_estimated=True), run(2, co2_kg=0.14, energy_estimated=False)])
    table = build_table(spec, estimated.iloc[:1])
    assert table["CO2"].iloc[0] == f"0.12 {MARK}"
    assert "estimated by CodeCarbon" in to_markdown(spec, table)
    measured = build_table(spec, estimated.iloc[1:])
    assert measured["CO2"].iloc[0] == "0.14" and "estimated by" not in to_markdown(spec, measured)

    shown = estimated.assign(energy_kwh=[0.5, 0.25])
    lines = runs_table(Group("all", "all", 2, shown, shown.iloc[0:0]))
    by_run = {line.rsplit("|", 2)[-2].strip(): line for line in lines[2:]}  # the run id is the last cell
    assert f"| 0.5 {MARK} | 0.12 {MARK} |" in by_run["r1"] and "| 0.25 | 0.14 |" in by_run["r2"]
    assert MARK not in by_run["r2"]


@pytest.mark.unit
def test_a_stage_yields_what_the_clock_books_to_it_and_nothing_without_a_clock(tmp_path):
    from replaceme_exp.pipeline.clock import StageClock
    from replaceme_exp.stages import StageCost, observed_by, stage

    with stage("capture", "alone") as cost:
        pass
    assert cost == StageCost()  # no clock: nothing measured, nothing made up
    clock = StageClock(StageEmissions(True, output_dir=tmp_path))
    try:
        with observed_by(clock):
            with stage("capture", "first") as first:
                sum(range(10**6))
            before = clock.emissions.columns()
            with stage("capture", "second") as second:
                sum(range(10**6))
    finally:
        clock.emissions.close()
    booked = clock.emissions.columns()
    assert second.seconds == clock.labelled["second"] and first.seconds == clock.labelled["first"]
    assert first.seconds + second.seconds == pytest.approx(clock.seconds["capture"], rel=1e-12)
    assert first.energy_kwh == before["energy_kwh_capture"] and first.co2_kg == before["co2_kg_capture"]
    assert second.energy_kwh == pytest.approx(booked["energy_kwh_capture"] - before["energy_kwh_capture"], rel=1e-9)
    assert second.co2_kg == pytest.approx(booked["co2_kg_capture"] - before["co2_kg_capture"], rel=1e-9)
    assert second.energy_kwh > 0 and second.co2_kg > 0


class FakeWandb:
    """A stand-in for the wandb module in the unit tests of our own glue (WandbRun's background
    start): records the thread ``init`` ran in; ``fail`` makes it raise."""

    def __init__(self, fail: bool = False):
        self.fail, self.threads, self.logged = fail, [], []

    def Settings(self, **kwargs):  # noqa: N802 - wandb's name
        return kwargs

    def init(self, **kwargs):
        import threading

        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("no wandb service")
        fake = self

        class Run:
            dir = str(Path(kwargs["dir"]) / "wandb" / "offline-run-x" / "files")
            summary = {}

            def log(self, data):
                fake.logged.append(data)

            def finish(self, exit_code=0):
                fake.logged.append({"exit_code": exit_code})

        return Run()


def tracker_with(fake, monkeypatch, tmp_path):
    import sys

    from replaceme_exp.config.schema import WandbConfig
    from replaceme_exp.tracking import WandbRun

    monkeypatch.setitem(sys.modules, "wandb", fake)
    row = {"run_id": "r1", "config_hash": "c1", "alpha": 0.5, "status": "running"}
    return WandbRun(WandbConfig(mode="offline"), {"alpha": 0.5}, row, tmp_path / "job"), row


@pytest.mark.unit
def test_the_wandb_run_opens_in_the_background_and_the_first_log_waits_for_it(tmp_path, monkeypatch):
    fake = FakeWandb()
    tracker, row = tracker_with(fake, monkeypatch, tmp_path)
    tracker.start()
    tracker.stage("load", 1.5)  # waits for the run
    assert fake.threads == ["wandb-start"]  # not the job's thread
    assert row["wandb_dir"] == str(tmp_path / "job" / "wandb" / "offline-run-x")
    row["ppl_heldout"] = 12.5
    tracker.finish({**row, "status": "finished"})
    assert {"stage/load_s": 1.5} in [{k: v for k, v in d.items() if k != "job/elapsed_s"} for d in fake.logged]
    assert any(d.get("ppl_heldout") == 12.5 for d in fake.logged) and fake.logged[-1] == {"exit_code": 0}


@pytest.mark.unit
def test_a_wandb_run_that_fails_to_open_costs_the_job_nothing(tmp_path, monkeypatch, caplog):
    tracker, row = tracker_with(FakeWandb(fail=True), monkeypatch, tmp_path)
    tracker.start()
    tracker.stage("load", 1.5)
    tracker.progress("capture", 1, 2)
    tracker.finish({**row, "status": "finished"})
    assert tracker.run is None and row.get("wandb_dir") is None
    said = [r.getMessage() for r in caplog.records if "W&B run not started" in r.getMessage()]
    assert said == ["W&B run not started: no wandb service"]


@pytest.mark.integration
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


@pytest.mark.integration
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
