"""The results store and what a skip trusts (issue 23): the latest run of a configuration by a
sequence number, not by a node's clock; a finished model checked whole before it is skipped; what
killed runs left removed; folders that cannot be written found before the compute; the Makefile's
values never run as commands; report names that never leave the output folder."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest
from helpers.config import ROOT


def dropping_root_override() -> list[str]:
    """A command prefix that runs without root's permission override (empty for a normal user)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: cannot make a folder read-only for the job")
    caps = "-dac_override,-dac_read_search,-fowner"
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", "--"]


@pytest.mark.slow
def test_a_read_only_results_folder_gives_one_line_a_non_zero_exit_and_no_traceback(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    args = ["debug=smoke", f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", "cuts=[[2,4]]"]
    try:
        proc = subprocess.run(
            [*dropping_root_override(), sys.executable, "run.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        runs.chmod(0o755)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if "ERROR" in line]
    assert len(errors) == 1, out[-3000:]
    assert f"{runs} is not writable" in errors[0] and "no row written" in errors[0]
