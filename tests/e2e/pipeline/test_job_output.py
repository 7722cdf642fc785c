"""What a person sees of a job: stage names, the summary line (also for a skipped job), generation
samples, a sweep's table, a quiet log, and a W&B run that exists from the job's start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.config import ROOT, compose_config
from helpers.job_output import WANDB_ON
from helpers.jobs import SMOKE

from replaceme_exp.results import ResultsStore


ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


DEFAULT_JOB = [*WANDB_ON, "calibration=self_generated"]  # the default job's calibration: self-generated chats


def run_logged(args: list[str], tmp_path: Path, name: str = "job.log") -> tuple[int, str]:
    """run.py with stdout and stderr going to a file (as under SLURM); returns (exit code, log)."""
    log = tmp_path / name
    with open(log, "w") as handle:
        code = subprocess.run(
            [sys.executable, "run.py", *args, f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats"],
            cwd=ROOT,
            env=ENV,
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=600,
        ).returncode
    return code, log.read_text()


@pytest.fixture(scope="module")
def default_tiny_job(tmp_path_factory):
    """The default job on the tiny model through run.py (W&B offline, the model saved), then the
    same job again."""
    tmp_path = tmp_path_factory.mktemp("tiny_job")
    first = run_logged([*DEFAULT_JOB, "save_model=full"], tmp_path, "first.log")
    second = run_logged([*DEFAULT_JOB, "save_model=full"], tmp_path, "second.log")
    return tmp_path, first, second


@pytest.mark.slow
def test_stage_names_say_what_runs_and_the_log_is_quiet(default_tiny_job):
    _, (code, log), _ = default_tiny_job
    assert code == 0, log[-3000:]
    for stage in ("baseline perplexity", "held-out distances", "pruned perplexity", "generation samples (pruned)"):
        assert f"stage {stage} done in" in log, stage
    assert "stage eval ..." not in log
    assert "wandb:" not in log  # no banner, no sparklines
    assert "Traceback" not in log


@pytest.mark.slow
def test_a_job_ends_with_one_summary_line_and_its_samples(default_tiny_job):
    tmp_path, (_, log), _ = default_tiny_job
    (row,) = ResultsStore(tmp_path).load().to_dict("records")
    summary = [line for line in log.splitlines() if f"job {row['run_id']} finished" in line]
    assert len(summary) == 1
    line = summary[0]
    assert "cuts [" in line and f"{row['ppl_heldout']:.2f}" in line and f"{row['ppl_heldout_baseline']:.2f}" in line
    assert f"row {tmp_path}/runs/{row['config_hash']}/{row['run_id']}.parquet" in line
    assert f"model {row['pruned_model_path']}" in line
    samples = json.loads(row["generation_samples"])
    assert [s["prompt"] for s in samples] == list(compose_config(SMOKE).eval.samples.prompts)
    assert "generation samples (greedy, chat template): unpruned | pruned" in log
    assert log.count("  unpruned: ") == len(samples) and log.count("  pruned:   ") == len(samples)


@pytest.mark.slow
def test_a_rerun_that_skips_prints_one_line_the_finished_jobs_summary(default_tiny_job):
    tmp_path, (_, first), (code, second) = default_tiny_job
    (row,) = ResultsStore(tmp_path).load().to_dict("records")
    assert code == 0
    (line,) = second.strip().splitlines()  # a skipped job prints one line: its finished row's summary
    assert f"job skipped: finished before as run {row['run_id']}" in line and f"{row['ppl_heldout']:.2f}" in line


@pytest.mark.slow
def test_bad_samples_are_refused_in_one_line(tmp_path):
    code, log = run_logged([*SMOKE, "eval.samples.max_new_tokens=0"], tmp_path)
    assert code == 1
    assert "failed in stage validation: ConfigError: eval.samples.max_new_tokens=0: must be a positive integer" in log
    assert log.count("ConfigError") == 1 and "Traceback" not in log and "stage load" not in log


@pytest.mark.slow
def test_a_stop_signal_leaves_a_failed_row_and_a_failed_wandb_run(tmp_path):
    """SIGTERM (a scheduler's kill) during the job: the row says so, the W&B run is finished as
    failed, and the process exits non-zero."""
    log = tmp_path / "job.log"
    args = [*WANDB_ON, f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats"]
    # The job waits in its first perplexity pass until the signal comes, so the signal always lands
    # mid-job (a tiny model's job can finish within one poll of the log on a fast machine).
    waiting_job = (
        "import runpy, sys, time\n"
        "import replaceme_exp.pipeline.text as text\n"
        "def waiting(model, windows):\n"
        "    print('waiting for the signal', flush=True)\n"
        "    time.sleep(300)\n"
        "text.window_perplexity = waiting\n"
        "sys.argv = ['run.py', *sys.argv[1:]]\n"
        "runpy.run_path('run.py', run_name='__main__')\n"
    )
    with open(log, "w") as handle:
        # unbuffered: the log line awaited below reaches the file when it is written, not at a flush
        proc = subprocess.Popen(
            [sys.executable, "-c", waiting_job, *args],
            cwd=ROOT,
            env=dict(ENV, PYTHONUNBUFFERED="1"),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 300
        while "waiting for the signal" not in log.read_text() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=300)
    text = log.read_text()
    assert code != 0, text[-2000:]
    (row,) = ResultsStore(tmp_path).load().to_dict("records")
    assert row["status"] == "failed" and row["error"] == "JobInterrupted: stopped by SIGTERM", text[-2000:]
    assert "stopped by SIGTERM" in text and "Traceback" not in text
    (run_file,) = (tmp_path / "hydra").rglob("offline-run-*/run-*.wandb")
    assert row["config_hash"].encode() in run_file.read_bytes()


@pytest.mark.slow
def test_one_command_finds_every_offline_run_to_sync(default_tiny_job):
    tmp_path, _, _ = default_tiny_job
    proc = subprocess.run(
        ["make", "-s", "-o", "setup", "wandb-sync", f"SWEEP={tmp_path}/hydra", "ARGS=--dry-run"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "offline runs to sync: 1" in out and "Would sync 1 run(s)" in out
