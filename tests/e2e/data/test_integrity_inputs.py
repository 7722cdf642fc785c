"""Issue 23, the job's inputs before the model loads: the contents of a user's files (calibration
text, JSON lines, prompts, held-out and healing text, image folders) and the hub datasets a job
needs are checked when it is about to run, each problem one line naming the key, the file (and the
line) and what to do, never after the model loaded or with a traceback.

Every test runs offline on an empty Hugging Face cache of its own (deterministic, whatever the
machine has cached)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.config import ROOT
from helpers.integrity_inputs import written
from helpers.jobs import SMOKE

from replaceme_exp.results import ResultsStore


@pytest.mark.slow
def test_run_py_refuses_a_binary_calibration_file_in_one_line_without_loading_the_model(tmp_path):
    bad = written(tmp_path, "calib.txt", b"\x7fELF\x02\x01\x01\x00\x00\x00binary")  # an executable's head
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    args = [*SMOKE, "calibration=text_file", f"calibration.path={bad}", f"results_dir={tmp_path}/results"]
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-2000:]
    line = f"ConfigError: calibration.path='{bad}': line 1 holds NUL bytes: a binary file, not text"
    assert line in log and "failed in stage validation" in log
    assert "Traceback" not in log and "stage load" not in log and log.count("ConfigError") == 1
    (row,) = ResultsStore(tmp_path / "results").load().to_dict("records")
    assert (row["status"], row["failed_stage"]) == ("failed", "validation")
