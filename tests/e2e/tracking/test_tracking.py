"""CodeCarbon and W&B around real jobs (offline), and where their files go."""

from __future__ import annotations

import pytest
from helpers.tracking import TRACKED


@pytest.mark.slow
def test_each_job_of_a_sweep_is_its_own_wandb_run_in_its_hydra_job_dir(tmp_path):
    from helpers.jobs import run_cli

    proc, _ = run_cli(["-m", *TRACKED, "tracking.codecarbon.enabled=false", "seed=1,2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted((tmp_path / "hydra" / "multirun").glob("*/*/wandb/offline-run-*"))
    assert [r.parts[-3] for r in runs] == ["0", "1"]  # the Hydra job subdirectories
    names = [next(r.glob("run-*.wandb")).read_bytes() for r in runs]
    assert all(b"seed=1" in n or b"seed=2" in n for n in names)
