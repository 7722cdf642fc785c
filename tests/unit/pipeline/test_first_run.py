"""The first run (docs/guides/first-run.md): self-generated answers cached batch by batch (resumed
after an interruption, reused by any smaller sample count, shipped for the default job), progress
lines inside a generation batch, the quick preset, and Ctrl-C that stops a sweep and a test run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from helpers.config import ROOT, compose_config, config_hash, typed
from helpers.first_run import ENV, reader, wait_for

from replaceme_exp import progress


def test_a_step_longer_than_every_seconds_still_gets_its_lines(caplog):
    """One step of a loop (a batch through the model on a busy CPU) that takes longer than
    ``every_seconds``: lines keep coming while it runs, not only when it ends."""
    with caplog.at_level("INFO", logger="replaceme_exp.progress"):
        with progress.Progress(3, "slow batches", "batch", mode="log", every_seconds=0.2) as counter:
            time.sleep(1.3)  # the first batch
            counter.update(1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("slow batches: 0/3")]
    assert len(lines) >= 3, caplog.text
    assert caplog.records[-1].getMessage().startswith("slow batches: 1/3 batches done")


def test_the_quick_preset_is_the_real_model_small_and_unsaved():
    default, quick = typed([]), typed(["debug=quick"])
    assert quick.model == default.model and quick.model.source == "embedded"
    assert quick.calibration.source == "generated" and quick.calibration.n_samples == 16
    assert quick.calibration.generation_batch_size == 16  # one batch: the shipped file's first
    assert quick.eval.max_windows == 4 and quick.eval.seq_len == 128 and quick.eval.samples is None
    assert quick.save_model is False
    assert quick.tracking.wandb.mode == "disabled" and quick.tracking.codecarbon.enabled is False
    assert config_hash(compose_config(["debug=quick"])) != config_hash(compose_config([]))
    objective = typed(["debug=quick", "objective=cosine", "n_prune=6"])  # other overrides still apply
    assert objective.objective.name == "cosine" and objective.n_prune == 6


def test_busy_cores_are_measured_now_not_from_the_lagging_load_average(tmp_path):
    """Two snapshots of /proc/stat's cpu line 0.25 s apart: 2 cores, one of them busy between them
    (user + system jiffies grew by as much as idle + iowait) is 1.0 busy core, whatever the load average."""
    from replaceme_exp.runtime.threads import busy_cores, cpu_times

    stat = tmp_path / "stat"
    snapshots = iter(["cpu  100 0 50 800 50 0 0 0 0 0\n", "cpu  130 0 70 840 60 0 0 0 0 0\n"])
    stat.write_text(next(snapshots))
    assert cpu_times(str(stat)) == (150.0, 1000.0)
    busy = busy_cores(2, stat=str(stat), sleep=lambda _: stat.write_text(next(snapshots)))
    assert busy == pytest.approx(2 * 50 / 100)
    assert busy_cores(2, stat=str(tmp_path / "missing"), sleep=lambda _: None) is None


def test_torch_threads_are_the_idle_cores_unless_chosen():
    from replaceme_exp.runtime.threads import chosen_threads

    assert chosen_threads({}, cores=2, load=0.2)[0] == 2  # idle: both cores
    assert chosen_threads({}, cores=2, load=1.3)[0] == 1  # another process on one core
    assert chosen_threads({}, cores=2, load=7.0)[0] == 1 and chosen_threads({}, cores=8, load=2.6)[0] == 5
    assert chosen_threads({"REPLACEME_THREADS": "3"}, cores=2, load=5.0) == (3, "REPLACEME_THREADS")
    assert chosen_threads({"OMP_NUM_THREADS": "1"}, cores=2, load=0.0)[0] is None  # torch follows it
    with pytest.raises(ValueError, match="REPLACEME_THREADS='x': must be a positive integer"):
        chosen_threads({"REPLACEME_THREADS": "x"})


SWALLOWING_JOB = """
import importlib.util, sys, time
# the module alone (the package would import torch: seconds)
spec = importlib.util.spec_from_file_location("signals", "replaceme_exp/runtime/signals.py")
signals = importlib.util.module_from_spec(spec)
spec.loader.exec_module(signals)
with signals.stop_signals_raise():
    print("waiting", flush=True)
    for _ in range(600):
        try:
            time.sleep(0.1)
        except Exception as err:  # code under the job that catches everything
            print("caught", err, flush=True)
print("left the block", flush=True)
time.sleep(60)
"""


def test_a_second_stop_signal_ends_the_process_at_once_even_if_the_first_was_caught():
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWING_JOB], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    lines = reader(proc)
    wait_for(proc, lines, "waiting")
    proc.send_signal(signal.SIGINT)
    wait_for(proc, lines, "caught stopped by SIGINT", 10)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=5)
    assert time.time() - sent < 3 and code == 128 + signal.SIGINT
    time.sleep(0.2)
    assert "SIGINT again: stopped at once (the interrupted job's row may be missing)\n" in lines, lines


@pytest.mark.slow
def test_a_burst_of_sigterms_is_one_stop_request_and_a_later_one_ends_the_process():
    """SLURM signals srun and its task, and srun forwards: the job sees two SIGTERMs milliseconds apart,
    which must not cut short the failed row the first one is writing."""
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWING_JOB], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    lines = reader(proc)
    wait_for(proc, lines, "waiting")
    proc.send_signal(signal.SIGTERM)
    first = time.time()
    wait_for(proc, lines, "caught stopped by SIGTERM", 10)
    proc.send_signal(signal.SIGTERM)  # after the first was handled (two pending signals would merge)
    assert time.time() - first < 1.0
    time.sleep(0.5)
    assert proc.poll() is None and sum("caught" in line for line in lines) == 1, lines
    time.sleep(2.0)  # past SAME_STOP_S: a new request
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 128 + signal.SIGTERM
    time.sleep(0.2)
    assert "SIGTERM again: stopped at once (the interrupted job's row may be missing)\n" in lines, lines


