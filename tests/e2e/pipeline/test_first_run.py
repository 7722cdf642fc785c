"""The first run (docs/guides/first-run.md): self-generated answers cached batch by batch (resumed
after an interruption, reused by any smaller sample count, shipped for the default job), progress
lines inside a generation batch, the quick preset, and Ctrl-C that stops a sweep and a test run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers.config import CACHE, ROOT, compose_config, config_hash, typed
from helpers.first_run import ENV, brute_force_answers, reader, wait_for

from replaceme_exp.data.generated import SHIPPED_ANSWERS, generation_batches, generation_key, shipped_entries
from replaceme_exp.models import load_model


DEFAULT_JOB_HASH = "ad9f667ff477ed92"  # 3104145b6f9b33af before the held-out documents (issue 49), 4ca25a03c0774d77 before eval=quick ran the offline tasks (same calibration)


@pytest.mark.slow
def test_the_shipped_answers_are_the_default_jobs_and_regenerate_alike():
    """Every batch of the default job's calibration is in the shipped file under exactly the key the
    job asks (so the first run generates nothing), and the embedded model, asked again, answers
    the first batch the same way: checked on the first 24 tokens of each answer (greedy decoding
    of a batch is the same step by step, whatever max_new_tokens), about 5 s instead of 30."""
    spec_cfg = typed([])
    cfg = spec_cfg.calibration
    loaded = load_model(spec_cfg.model, str(CACHE))
    assert config_hash(compose_config([]), loaded.identity["weights"]) == DEFAULT_JOB_HASH  # what it computes
    _, batches = generation_batches(cfg)
    assert len(batches) == cfg.n_samples // cfg.generation_batch_size == 8
    keys = [
        generation_key(loaded.identity_hash, b, [p for a in batches[:i] for p in a], cfg) for i, b in enumerate(batches)
    ]
    shipped = {json.dumps(e["key"], sort_keys=True): e["value"] for e in shipped_entries(SHIPPED_ANSWERS).values()}
    for key, batch in zip(keys, batches):
        entry = shipped.get(json.dumps(key, sort_keys=True))
        assert entry is not None, f"make self-generated-answers: the shipped file holds no batch for key {key}"
        assert entry["prompts"] == batch and len(entry["answers"]) == len(batch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the file was made (make self-generated-answers)
    try:
        again = brute_force_answers(loaded.model, loaded.tokenizer, batches[0], len(batches[0]), 24)
    finally:
        torch.set_num_threads(threads)
    first = shipped[json.dumps(keys[0], sort_keys=True)]["answers"]
    for short, full in zip(again, first):
        assert full.startswith(short.rstrip("\ufffd").rstrip()), (short, full)


@pytest.mark.slow
def test_two_ctrl_c_stop_a_sweep_at_once(tmp_path):
    args = [
        "run.py",
        "-m",
        "debug=smoke",
        "alpha=0,1,2,3",
        f"results_dir={tmp_path}",
        f"capture.cache_dir={tmp_path}/s",
    ]
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    lines = reader(proc)
    wait_for(proc, lines, "stage load")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    sent = time.time()
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=10)
    assert time.time() - sent < 5 and code != 0, "".join(lines)[-2000:]
    assert len(list((tmp_path / "runs").rglob("*.parquet"))) <= 1  # no second job of the sweep ran


@pytest.mark.skipif(not os.environ.get("REPLACEME_WAIT_FOR_CTRL_C"), reason="run by the Ctrl-C test below")
def test_a_job_under_test_waits_for_ctrl_c():
    from replaceme_exp.runtime.signals import stop_signals_raise

    with stop_signals_raise():
        print("job waiting", flush=True)
        time.sleep(120)


@pytest.mark.skipif(not os.environ.get("REPLACEME_WAIT_FOR_CTRL_C"), reason="run by the Ctrl-C test below")
def test_after_the_waiting_job(tmp_path):
    open(os.environ["REPLACEME_WAIT_FOR_CTRL_C"], "w").close()


WAITING_TEST = "tests/e2e/pipeline/test_first_run.py::test_a_job_under_test_waits_for_ctrl_c"


@pytest.mark.slow
def test_one_ctrl_c_stops_a_test_run(tmp_path):
    """A job under test turns SIGINT into its failed row; pytest (tests/conftest.py) still stops at
    the first Ctrl-C instead of failing that test and running the next."""
    marker = tmp_path / "ran"
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", WAITING_TEST,
               "tests/e2e/pipeline/test_first_run.py::test_after_the_waiting_job"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=dict(ENV, REPLACEME_WAIT_FOR_CTRL_C=str(marker)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    lines = reader(proc)
    wait_for(proc, lines, "job waiting")
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=20)
    assert time.time() - sent < 10 and code == 2, "".join(lines)  # pytest's "interrupted"
    assert not marker.exists() and any("KeyboardInterrupt" in line for line in lines), "".join(lines)
