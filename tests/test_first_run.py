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
from helpers.generation import answering_tiny_model, generation_option

from replaceme_exp import progress
from replaceme_exp.data import generated
from replaceme_exp.data.generated import (
    SHIPPED_ANSWERS,
    chosen_prompts,
    generation_batches,
    generation_key,
    load_prompts,
    self_generated_documents,
    shipped_entries,
)
from replaceme_exp.data.sources import render_prompts
from replaceme_exp.models import load_model

DEFAULT_JOB_HASH = "ad9f667ff477ed92"  # 3104145b6f9b33af before the held-out documents (issue 49), 4ca25a03c0774d77 before eval=quick ran the offline tasks (same calibration)


@pytest.fixture(scope="module")
def tiny():
    return answering_tiny_model()


def generation_config(**overrides):
    return generation_option(**{"n_samples": 6, "generation_batch_size": 2, **overrides})


@pytest.fixture
def counted(monkeypatch):
    """The prompts of each generate_batch call (the real one runs)."""
    calls: list[list[str]] = []
    real = generated.generate_batch

    def counting(model, tokenizer, prompts, *args, **kwargs):
        calls.append(list(prompts))
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(generated, "generate_batch", counting)
    return calls


def assistant_answers(documents: list[str]) -> list[str]:
    return [d.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n") for d in documents]


def brute_force_answers(model, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int) -> list[str]:
    """Greedy answers by plain ``model.generate`` calls on left-padded batches of ``batch_size``
    consecutive prompts (written out here, not the project's generation code)."""
    answers = []
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        for start in range(0, len(prompts), batch_size):
            texts = render_prompts(tokenizer, prompts[start : start + batch_size])
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)  # fmt: skip
            decoded = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            answers += [a.strip() for a in decoded]
    finally:
        tokenizer.padding_side = side
    return answers


# --- answers cached batch by batch -----------------------------------------------------------------


@pytest.mark.integration
def test_an_interrupted_generation_resumes_at_its_first_unfinished_batch(tiny, tmp_path, monkeypatch, counted):
    cfg = generation_config(n_samples=6, generation_batch_size=2)
    whole = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "whole")
    assert len(counted) == 3
    real, calls = generated.generate_batch, []

    def stopped_at_the_third(model, tokenizer, prompts, *args, **kwargs):
        calls.append(prompts)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(generated, "generate_batch", stopped_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "cut")
    assert len(list((tmp_path / "cut" / "generated").glob("*.json"))) == 2  # the two finished batches kept
    calls.clear()
    resumed = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "cut")
    assert resumed == whole and calls == [counted[2]]  # only the third batch generated again
    assert len(list((tmp_path / "cut" / "generated").glob("*.json"))) == 3


@pytest.mark.integration
def test_a_smaller_count_reuses_the_answers_of_a_larger_one_as_brute_force_gives_them(tiny, tmp_path, counted):
    """The answer of a prompt is its answer in its batch of the seeded pool order, whatever
    ``n_samples`` asks: 8 answered in batches of 4, then 3 and 5 reuse them; 10 answers one more
    batch of 4 (prompts 9-12) and uses two of it."""
    pool = chosen_prompts(load_prompts(None), 12, 0)
    expected = brute_force_answers(tiny.model, tiny.tokenizer, pool, 4, 5)
    assert len(set(expected)) > 4  # real, differing answers

    def answers(n):
        cfg = generation_config(n_samples=n, generation_batch_size=4)
        return assistant_answers(
            self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path)
        )

    assert answers(8) == expected[:8] and len(counted) == 2
    assert answers(3) == expected[:3] and answers(5) == expected[:5] and len(counted) == 2
    assert answers(10) == expected[:10] and counted[-1] == pool[8:12] and len(counted) == 3
    prompts, batches = generation_batches(generation_config(n_samples=10, generation_batch_size=4))
    assert prompts == pool[:10] and batches == [pool[0:4], pool[4:8], pool[8:12]]


@pytest.mark.integration
def test_sampled_answers_resume_with_the_random_state_they_stopped_at(tiny, tmp_path, monkeypatch):
    cfg = generation_config(n_samples=4, generation_batch_size=2, temperature=1.0, seed=5, max_new_tokens=6)
    whole = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "whole")
    first = generation_config(n_samples=2, generation_batch_size=2, temperature=1.0, seed=5, max_new_tokens=6)
    self_generated_documents(first, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "resumed")
    torch.manual_seed(123)  # whatever the process did in between
    resumed = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "resumed")
    assert resumed == whole


@pytest.mark.integration
def test_progress_lines_come_inside_one_generation_batch(tiny, tmp_path, caplog):
    """One batch of 2 prompts x 6 new tokens; a fake clock 31 s further at each reading: a progress
    line (and a listener call) at each decoding step, not only when the batch ends."""
    ticks = iter(range(0, 10_000, 31))
    seen = []
    saved = progress.settings()
    progress.configure(mode="log", every_percent=100)
    progress.add_listener(lambda desc, done, total: seen.append((desc, done, total)))
    try:
        cfg = generation_config(n_samples=2, generation_batch_size=2, max_new_tokens=6)
        with caplog.at_level("INFO", logger="replaceme_exp.progress"):
            self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path,
                                     clock=lambda: next(ticks))  # fmt: skip
    finally:
        progress._listeners.clear()
        progress.configure(**saved)
    inside = [done for desc, done, total in seen if desc == "generating calibration answers" and done < total]
    assert inside[:3] == [2, 4, 6] and seen[-1] == ("generating calibration answers", 12, 12)
    assert "generating calibration answers: 2/12 tokens (17%), 31.0 s elapsed" in caplog.text


@pytest.mark.unit
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


# --- the shipped answers ---------------------------------------------------------------------------


@pytest.mark.e2e
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


@pytest.mark.unit
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


# --- threads -------------------------------------------------------------------------------------


@pytest.mark.unit
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


@pytest.mark.unit
def test_torch_threads_are_the_idle_cores_unless_chosen():
    from replaceme_exp.runtime.threads import chosen_threads

    assert chosen_threads({}, cores=2, load=0.2)[0] == 2  # idle: both cores
    assert chosen_threads({}, cores=2, load=1.3)[0] == 1  # another process on one core
    assert chosen_threads({}, cores=2, load=7.0)[0] == 1 and chosen_threads({}, cores=8, load=2.6)[0] == 5
    assert chosen_threads({"REPLACEME_THREADS": "3"}, cores=2, load=5.0) == (3, "REPLACEME_THREADS")
    assert chosen_threads({"OMP_NUM_THREADS": "1"}, cores=2, load=0.0)[0] is None  # torch follows it
    with pytest.raises(ValueError, match="REPLACEME_THREADS='x': must be a positive integer"):
        chosen_threads({"REPLACEME_THREADS": "x"})


# --- Ctrl-C ----------------------------------------------------------------------------------------

ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

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


def wait_for(proc, stream_lines: list[str], text: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not any(text in line for line in stream_lines) and time.time() < deadline:
        assert proc.poll() is None, stream_lines
        time.sleep(0.05)
    assert any(text in line for line in stream_lines), stream_lines


def reader(proc) -> list[str]:
    import threading

    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return lines


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.e2e
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


WAITING_TEST = "tests/test_first_run.py::test_a_job_under_test_waits_for_ctrl_c"


@pytest.mark.unit
@pytest.mark.skipif(not os.environ.get("REPLACEME_WAIT_FOR_CTRL_C"), reason="run by the Ctrl-C test below")
def test_a_job_under_test_waits_for_ctrl_c():
    from replaceme_exp.runtime.signals import stop_signals_raise

    with stop_signals_raise():
        print("job waiting", flush=True)
        time.sleep(120)


@pytest.mark.unit
@pytest.mark.skipif(not os.environ.get("REPLACEME_WAIT_FOR_CTRL_C"), reason="run by the Ctrl-C test below")
def test_after_the_waiting_job(tmp_path):
    open(os.environ["REPLACEME_WAIT_FOR_CTRL_C"], "w").close()


@pytest.mark.e2e
@pytest.mark.slow
def test_one_ctrl_c_stops_a_test_run(tmp_path):
    """A job under test turns SIGINT into its failed row; pytest (tests/conftest.py) still stops at
    the first Ctrl-C instead of failing that test and running the next."""
    marker = tmp_path / "ran"
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", WAITING_TEST,
               "tests/test_first_run.py::test_after_the_waiting_job"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=dict(ENV, REPLACEME_WAIT_FOR_CTRL_C=str(marker)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    lines = reader(proc)
    wait_for(proc, lines, "job waiting")
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=20)
    assert time.time() - sent < 10 and code == 2, "".join(lines)  # pytest's "interrupted"
    assert not marker.exists() and any("KeyboardInterrupt" in line for line in lines), "".join(lines)
