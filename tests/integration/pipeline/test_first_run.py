"""The first run (docs/guides/first-run.md): self-generated answers cached batch by batch (resumed
after an interruption, reused by any smaller sample count, shipped for the default job), progress
lines inside a generation batch, the quick preset, and Ctrl-C that stops a sweep and a test run."""

from __future__ import annotations

import pytest
import torch
from helpers.first_run import brute_force_answers
from helpers.generation import answering_tiny_model, generation_option

from replaceme_exp import progress
from replaceme_exp.data import generated
from replaceme_exp.data.generated import chosen_prompts, generation_batches, load_prompts, self_generated_documents


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


def test_sampled_answers_resume_with_the_random_state_they_stopped_at(tiny, tmp_path, monkeypatch):
    cfg = generation_config(n_samples=4, generation_batch_size=2, temperature=1.0, seed=5, max_new_tokens=6)
    whole = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "whole")
    first = generation_config(n_samples=2, generation_batch_size=2, temperature=1.0, seed=5, max_new_tokens=6)
    self_generated_documents(first, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "resumed")
    torch.manual_seed(123)  # whatever the process did in between
    resumed = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "resumed")
    assert resumed == whole


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
