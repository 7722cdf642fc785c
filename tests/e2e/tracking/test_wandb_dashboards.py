"""W&B as a team reads it: metrics logged as they are produced, sample tables, one group per
sweep, the offline run file read back, a sync that fails fast offline and writes nothing where it
is run, and a workspace definition built without a server."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers.config import ROOT
from helpers.jobs import SMOKE

from replaceme_exp.tracking.wandb_offline import read_offline_run


def test_sync_without_a_server_fails_in_one_line_within_its_timeout_and_writes_nothing_here(tmp_path):
    runs = tmp_path / "results" / "hydra" / "multirun" / "s1" / "0" / "wandb" / "offline-run-20260101_000000-abc"
    runs.mkdir(parents=True)
    cwd = tmp_path / "here"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_BASE_URL="http://127.0.0.1:9", WANDB_API_KEY="x" * 40, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "replaceme_exp.tracking.wandb_sync", str(tmp_path / "results"), "--timeout", "5"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert time.monotonic() - started < 30
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines == ["could not reach the W&B server at http://127.0.0.1:9 in 5 s (Connection refused); nothing synced"]
    assert "offline runs to sync: 1" in proc.stdout
    assert list(cwd.iterdir()) == []  # no wandb/ folder, nothing


@pytest.mark.slow
def test_a_sweep_over_two_method_presets_is_one_wandb_group(tmp_path):
    from helpers.jobs import run_cli

    from replaceme_exp.results import ResultsStore

    proc, _ = run_cli(["-m", *SMOKE, "experiment=replaceme_ls,uidl_baseline", "tracking.wandb.mode=offline"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = ResultsStore(tmp_path).load()
    assert (
        len(rows) == 2
        and rows["sweep_group"].nunique() == 1
        and rows["sweep_name"].iloc[0] == "experiment=replaceme_ls,uidl_baseline"
    )
    groups = {read_offline_run(d).group for d in (tmp_path / "hydra" / "multirun").glob("*/*/wandb/offline-run-*")}
    assert groups == {rows["sweep_group"].iloc[0]}
