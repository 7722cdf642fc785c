"""CodeCarbon and W&B around real jobs (offline), and where their files go."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaceme_exp.tracking import StageEmissions


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


def test_an_unknown_region_is_refused_in_one_line():
    from replaceme_exp.errors import ConfigError
    from replaceme_exp.tracking.emissions import check_region

    check_region("USA", "washington")
    check_region("USA", None)
    with pytest.raises(ConfigError, match="tracking.codecarbon.region.*nowhere.*not a region of USA"):
        check_region("USA", "nowhere")
    with pytest.raises(ConfigError, match="no regional grid data for FRA"):
        check_region("FRA", "bretagne")


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


def test_a_wandb_run_that_fails_to_open_costs_the_job_nothing(tmp_path, monkeypatch, caplog):
    tracker, row = tracker_with(FakeWandb(fail=True), monkeypatch, tmp_path)
    tracker.start()
    tracker.stage("load", 1.5)
    tracker.progress("capture", 1, 2)
    tracker.finish({**row, "status": "finished"})
    assert tracker.run is None and row.get("wandb_dir") is None
    said = [r.getMessage() for r in caplog.records if "W&B run not started" in r.getMessage()]
    assert said == ["W&B run not started: no wandb service"]
