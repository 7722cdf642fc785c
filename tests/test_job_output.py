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

import pandas as pd
import pytest
import torch
from helpers.config import CACHE, ROOT, compose_config
from helpers.jobs import SMOKE, job_config

from replaceme_exp.config.validate import typed_config
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.job_summary import sample_lines, summary_line
from replaceme_exp.runtime.sweep_summary import summary_lines

ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
WANDB_ON = [*SMOKE, "tracking.wandb.mode=offline"]  # W&B as by default
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


@pytest.mark.e2e
@pytest.mark.slow
def test_stage_names_say_what_runs_and_the_log_is_quiet(default_tiny_job):
    _, (code, log), _ = default_tiny_job
    assert code == 0, log[-3000:]
    for stage in ("baseline perplexity", "held-out distances", "pruned perplexity", "generation samples (pruned)"):
        assert f"stage {stage} done in" in log, stage
    assert "stage eval ..." not in log
    assert "wandb:" not in log  # no banner, no sparklines
    assert "Traceback" not in log


@pytest.mark.e2e
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


@pytest.mark.e2e
@pytest.mark.slow
def test_a_rerun_that_skips_prints_one_line_the_finished_jobs_summary(default_tiny_job):
    tmp_path, (_, first), (code, second) = default_tiny_job
    (row,) = ResultsStore(tmp_path).load().to_dict("records")
    assert code == 0
    (line,) = second.strip().splitlines()  # a skipped job prints one line: its finished row's summary
    assert f"job skipped: finished before as run {row['run_id']}" in line and f"{row['ppl_heldout']:.2f}" in line


@pytest.mark.integration
def test_generation_samples_equal_greedy_decoding_of_the_models(tmp_path):
    """The row's answers are the greedy answers of the saved pruned model and of the unpruned
    model built again from its config, decoded here with plain transformers calls."""
    from transformers import AutoModelForCausalLM

    from replaceme_exp.models import load_model

    cfg = job_config(tmp_path, "eval.samples.max_new_tokens=6", "save_model=full")
    row = run_recorded(cfg)
    assert row["status"] == "finished", row["error"]
    loaded = load_model(typed_config(cfg).model, str(CACHE))
    tokenizer = loaded.tokenizer
    pruned = AutoModelForCausalLM.from_pretrained(row["pruned_model_path"], dtype=torch.float32).eval()
    for sample in row["generation_samples"]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": sample["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        for model, answer in ((loaded.model, sample["unpruned"]), (pruned, sample["pruned"])):
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
            assert tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip() == answer


@pytest.mark.unit
def test_samples_are_not_part_of_the_config_hash(tmp_path):
    from helpers.config import config_hash

    assert config_hash(job_config(tmp_path)) == config_hash(job_config(tmp_path, "eval.samples=null"))


@pytest.mark.e2e
@pytest.mark.slow
def test_bad_samples_are_refused_in_one_line(tmp_path):
    code, log = run_logged([*SMOKE, "eval.samples.max_new_tokens=0"], tmp_path)
    assert code == 1
    assert "failed in stage validation: ConfigError: eval.samples.max_new_tokens=0: must be a positive integer" in log
    assert log.count("ConfigError") == 1 and "Traceback" not in log and "stage load" not in log


@pytest.mark.integration
@pytest.mark.slow
def test_the_wandb_run_exists_from_the_start_and_a_midway_failure_finishes_it_as_failed(tmp_path, monkeypatch):
    """The offline run is open before evaluation starts; a job failing in its pruned-perplexity
    stage leaves a run holding run_id, config_hash, its group and status failed, and the row
    names the stage."""
    import replaceme_exp.pipeline.text as job

    cfg = compose_config(WANDB_ON + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats"])
    seen = []
    original = job.window_perplexity

    def failing_perplexity(model, windows):
        seen.append(list((tmp_path / "job" / "wandb").glob("offline-run-*/run-*.wandb")))
        if len(seen) == 1:
            return original(model, windows)  # the baseline
        raise RuntimeError("out of memory in the pruned model's pass")

    monkeypatch.setattr(job, "window_perplexity", failing_perplexity)
    row = run_recorded(cfg, job_dir=tmp_path / "job", raise_on_failure=False, sweep_name="paper/x", sweep_id="s1")
    assert row["status"] == "failed" and row["failed_stage"] == "pruned perplexity"
    assert len(seen[0]) == 1  # the run was open before the first evaluation
    (run_dir,) = (tmp_path / "job" / "wandb").glob("offline-run-*")
    assert seen[0][0].parent == run_dir
    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    for key in (row["run_id"], row["config_hash"], "paper/x s1", "failed", "out of memory"):
        assert key.encode() in data, key
    assert row["wandb_dir"] == str(run_dir)


@pytest.mark.e2e
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


@pytest.mark.unit
def test_the_sweep_table_lists_each_job():
    statuses = [
        {"overrides": "alpha=0", "status": "finished", "cuts": [[1, 3]], "ppl_heldout_baseline": 20.0,
         "ppl_heldout": 25.5, "avg_acc": 0.61, "rp": 0.8, "time_total_s": 81.0},
        {"overrides": "alpha=-1", "status": "failed", "error": "ConfigError: alpha=-1: must be >= 0",
         "failed_stage": "validation"},
    ]  # fmt: skip
    lines = summary_lines(statuses)
    assert lines[0] == "sweep: 1 finished, 0 skipped, 1 failed"
    assert "20.00 -> 25.50" in lines[2] and "0.610" in lines[2] and "81 s" in lines[2] and "[1,3)" in lines[2]
    assert lines[3].endswith("alpha=-1: failed in validation: ConfigError: alpha=-1: must be >= 0")


@pytest.mark.unit
def test_summary_line_of_a_failed_and_of_an_evaluated_row():
    failed = {"run_id": "r1", "status": "failed", "failed_stage": "capture (selection)", "time_total_s": 3.0,
              "error": "NonFiniteError: capture: nan\nmore"}  # fmt: skip
    expected = "job r1 failed in stage capture (selection) after 3 s: NonFiniteError: capture: nan"
    assert summary_line(failed) == expected
    row = {"run_id": "r2", "status": "finished", "cuts": "[[11, 19]]", "ppl_heldout_baseline": 21.21,
           "ppl_heldout": 50.25, "avg_acc_baseline": 0.91, "avg_acc": 0.61, "rp": 0.67,
           "time_total_s": 200.0}  # fmt: skip
    line = summary_line(row)
    assert line == (
        "job r2 finished, cuts [11,19), held-out ppl 21.21 -> 50.25 (x2.37), avg_acc 0.910 -> 0.610, rp 0.670, 3.3 min"
    )
    assert sample_lines(row) == []
    samples = pd.Series({"generation_samples": json.dumps([{"prompt": "Q?", "unpruned": "A\nB", "pruned": ""}])})
    assert sample_lines(samples.to_dict())[1:] == ["  prompt:   Q?", "  unpruned: A ⏎ B", "  pruned:   "]


@pytest.mark.e2e
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


@pytest.mark.unit
def test_prefix_console_prefixes_each_console_line_not_the_log_file(tmp_path):
    import io
    import logging

    from replaceme_exp.runtime.log_files import prefix_console

    root, stream = logging.getLogger(), io.StringIO()
    console, file = logging.StreamHandler(stream), logging.FileHandler(tmp_path / "run.log")
    for handler in (console, file):
        handler.setFormatter(logging.Formatter("[%(levelname)s] - %(message)s"))
    saved = root.handlers[:], root.level
    root.handlers[:] = [console, file]
    root.setLevel(logging.INFO)
    try:
        prefix_console("[job 3] ")
        prefix_console("[job 3] ")  # once only
        logging.getLogger("replaceme_exp.job").info("stage load ...\nsecond line")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        file.close()
    assert stream.getvalue().splitlines() == ["[job 3] [INFO] - stage load ...", "[job 3] second line"]
    assert (tmp_path / "run.log").read_text().splitlines() == ["[INFO] - stage load ...", "second line"]


@pytest.mark.unit
def test_the_summary_of_a_job_that_saved_its_transforms_says_how_to_export_the_checkpoint():
    row = {"run_id": "r1", "status": "finished", "config_hash": "abc", "cuts": [[2, 4]], "time_total_s": 3.0}
    row.update(saved_model="transform", transforms_path="results/transforms/abc.safetensors", pruned_model_path=None)
    line = summary_line(row)
    assert line.endswith("transforms results/transforms/abc.safetensors (the checkpoint: make export RUN=abc)")
    full = summary_line({**row, "saved_model": "full", "pruned_model_path": "results/models/abc"})
    assert full.endswith("model results/models/abc") and "export" not in full
