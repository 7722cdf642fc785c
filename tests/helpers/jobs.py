"""The tiny job: the ``debug=smoke`` preset (conf/debug/smoke.yaml), in process or through run.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from helpers.config import ROOT, compose_config

# tiny_llama, 24 pydoc sequences of 64 tokens, 2 blocks pruned, 4 perplexity windows, no tracking and no
# speed stage (tracking and speed have their own tests, tests/*/tracking and tests/*/evaluation/test_speed*;
# here they would only cost time: the speed stage is half of a tiny job). Speed is not in the config hash.
SMOKE = ["debug=smoke", "eval.speed.enabled=false"]


def job_config(tmp_path, *overrides):
    """The tiny job, writing rows and capture statistics under ``tmp_path``."""
    return compose_config(SMOKE + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", *overrides])


def run_cli(args, results_dir):
    """``python run.py *args`` offline with results and statistics under ``results_dir``: (process, seconds)."""
    args = [*args, f"capture.cache_dir={results_dir}/stats"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HYDRA_FULL_ERROR="1")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "run.py", *args, f"results_dir={results_dir}", "save_model=false"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, time.perf_counter() - start
