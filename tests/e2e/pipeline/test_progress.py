"""Progress of long loops: a bar on a terminal, log lines a person can follow in a file, and lm-eval
quiet about the project's own tasks."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers.config import ROOT
from helpers.jobs import SMOKE


@pytest.mark.slow
def test_a_job_logging_to_a_file_shows_progress_and_no_lm_eval_warnings_about_our_tasks(tmp_path):
    """stdout and stderr go to a file (never a terminal): progress comes as log lines, without the
    job calling configure (mode auto), and lm-eval has nothing to say about the project's tasks."""
    log_file = tmp_path / "job.log"
    args = [*SMOKE, "eval=offline", "eval.batch_size=1", "eval.harness.limit=6", "save_model=false"]
    args += [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HYDRA_FULL_ERROR="1")
    env.pop("LMEVAL_LOG_LEVEL", None)
    with open(log_file, "w") as out:
        proc = subprocess.run(
            [sys.executable, "run.py", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600
        )
    text = log_file.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert re.search(r"\[replaceme_exp\.progress\]\[INFO\] - capture \(selection\): \d+/\d+ batches", text)
    assert re.search(r"perplexity: \d+/\d+ batches \(\d+%\), [\d.]+ s elapsed, ~[\d.]+ s left", text)
    assert re.search(r"perplexity: (\d+)/\1 batches done in", text)
    assert re.search(r"held-out distances: (\d+)/\1 batches done in", text)
    assert re.search(r"lm-eval loglikelihood: (\d+)/\1 requests done in", text)
    assert re.search(r"lm-eval loglikelihood_rolling: (\d+)/\1 windows done in", text)
    assert "Running loglikelihood requests" not in text  # lm-eval's own bars are off in a file
    warnings = [line for line in text.splitlines() if "WARNING" in line]
    ours = [line for line in warnings if "replaceme_" in line or "lm_eval_tasks" in line]
    assert not ours, ours
    assert not [line for line in warnings if "[lm_eval" in line and "pretrained" in line]
