"""Nothing wrong, nothing lost: bad input refused before any model loads, rows and models that
survive kills, full disks, concurrent identical jobs and broken row files."""

from __future__ import annotations

import os

import pytest


@pytest.mark.slow
def test_a_results_dir_that_is_a_file_stops_the_cli_with_one_line_before_hydra_writes(tmp_path):
    import subprocess
    import sys

    from helpers.config import ROOT

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    sweep = ["-m", f"cache_dir={blocker}", "alpha=1,2", f"results_dir={tmp_path}"]
    for args in ([f"results_dir={blocker}/sub"], sweep):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "is a file, not a directory" in out and "Traceback" not in out
