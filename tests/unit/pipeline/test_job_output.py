"""What a person sees of a job: stage names, the summary line (also for a skipped job), generation
samples, a sweep's table, a quiet log, and a W&B run that exists from the job's start."""

from __future__ import annotations

import json

import pandas as pd
from helpers.jobs import job_config

from replaceme_exp.runtime.job_summary import sample_lines, summary_line
from replaceme_exp.runtime.sweep_summary import summary_lines


def test_samples_are_not_part_of_the_config_hash(tmp_path):
    from helpers.config import config_hash

    assert config_hash(job_config(tmp_path)) == config_hash(job_config(tmp_path, "eval.samples=null"))


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


def test_the_summary_of_a_job_that_saved_its_transforms_says_how_to_export_the_checkpoint():
    row = {"run_id": "r1", "status": "finished", "config_hash": "abc", "cuts": [[2, 4]], "time_total_s": 3.0}
    row.update(saved_model="transform", transforms_path="results/transforms/abc.safetensors", pruned_model_path=None)
    line = summary_line(row)
    assert line.endswith("transforms results/transforms/abc.safetensors (the checkpoint: make export RUN=abc)")
    full = summary_line({**row, "saved_model": "full", "pruned_model_path": "results/models/abc"})
    assert full.endswith("model results/models/abc") and "export" not in full
