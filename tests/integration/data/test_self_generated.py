"""Self-generated chat calibration (``calibration=self_generated``): the shipped prompts, answers
equal to plain greedy decoding, a cache keyed by content, and a job that runs on it."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers.config import CACHE, typed
from helpers.generation import answering_tiny_model, generation_option
from helpers.jobs import job_config
from helpers.self_generated import slimorca_file

from replaceme_exp.data.generated import chosen_prompts, load_prompts, self_generated_documents
from replaceme_exp.runtime import run_recorded


@pytest.fixture(scope="module")
def tiny():
    return answering_tiny_model()


def generation_config(**overrides):
    """A typed ``source: generated`` calibration option with these generation settings."""
    return generation_option(**{"n_samples": 3, "generation_batch_size": 1, **overrides})


def test_documents_are_the_prompts_and_the_models_own_greedy_answers(tiny, tmp_path):
    """Each document is the chat template of (prompt, answer), where answer is what a plain
    ``generate`` call on the prompt alone returns greedily."""
    cfg = generation_config()
    documents = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path)
    tokenizer = tiny.tokenizer
    answers = [d.rsplit("<|im_start|>assistant\n", 1)[1] for d in documents]
    # real, differing answers
    assert all(a.replace("<|im_end|>", "").strip() for a in answers) and len(set(answers)) > 1
    for prompt, document in zip(chosen_prompts(load_prompts(None), 3, 0), documents):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        out = tiny.model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
        expected = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}], tokenize=False
        )
        assert document == expected


def test_answers_are_cached_by_content(tiny, tmp_path, monkeypatch):
    calls = []
    generate = tiny.model.generate

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return generate(*args, **kwargs)

    monkeypatch.setattr(tiny.model, "generate", counting)
    cfg = generation_config(generation_batch_size=2)
    first = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path)
    assert calls == [2, 2]  # batches of 2: the 4th prompt answered too (the batches do not depend on n_samples)
    again = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path)
    assert again == first and calls == [2, 2]  # from the cache
    longer = self_generated_documents(
        generation_config(generation_batch_size=2, max_new_tokens=7), tiny.tokenizer, tiny.model,
        tiny.identity_hash, tmp_path,
    )  # fmt: skip
    assert len(calls) == 4 and longer != first
    self_generated_documents(cfg, tiny.tokenizer, tiny.model, "another-model", tmp_path)
    assert len(calls) == 6
    assert len(list((tmp_path / "generated").glob("*.json"))) == 6  # one entry per batch


def test_sampled_answers_follow_the_seed(tiny, tmp_path):
    def answers(seed):
        cfg = generation_config(temperature=1.0, seed=seed, max_new_tokens=8)
        return self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / str(seed))

    assert answers(1) == answers(1)
    assert answers(1) != answers(2)


@pytest.mark.slow
def test_a_job_calibrates_on_self_generated_chats(tmp_path):
    overrides = ["calibration=self_generated", "calibration.n_samples=8", "calibration.max_new_tokens=8"]
    row = run_recorded(job_config(tmp_path, *overrides, "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["calibration"] == "self_generated" and row["n_calib_tokens"] > 8 * 8
    # 8 samples are the first 8 prompts of the first generation batch (16, the batch size): the
    # whole batch is answered and cached, whatever n_samples takes of it
    batch = chosen_prompts(load_prompts(None), 16, 42)
    assert batch[:8] == chosen_prompts(load_prompts(None), 8, 42)
    cached = [json.loads(f.read_text()).get("value") or {} for f in (CACHE / "generated").glob("*.json")]
    assert any(c.get("prompts") == batch and len(c.get("answers", [])) == 16 for c in cached)


def test_orca_generated_answers_slimorca_prompts_with_the_model_itself(tiny, tmp_path):
    """The paper's orca_generated: SlimOrca's first user turns, answered by the model being pruned
    (not SlimOrca's answers), read here from a local file in SlimOrca's format through the same
    ``datasets`` path the hub preset takes."""
    cfg = typed(["calibration=orca_generated"]).calibration
    assert cfg.prompts_dataset == "Open-Orca/SlimOrca" and cfg.prompts_chat_field == "conversations"
    settings = generation_config(n_samples=4, seed=3)
    generation = ("n_samples", "max_new_tokens", "generation_batch_size", "temperature", "seed")
    cfg = dataclasses.replace(cfg, **{k: getattr(settings, k) for k in generation})
    cfg.prompts_dataset, cfg.prompts_data_files, cfg.streaming = "json", str(slimorca_file(tmp_path / "s.jsonl")), False
    documents = self_generated_documents(cfg, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path)
    users = [d.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0] for d in documents]
    assert len(set(users)) == 4 and all(u.startswith("Question number") for u in users)
    assert not any("SlimOrca's own answer" in d or "helpful assistant" in d for d in documents)
    plain = generation_config(n_samples=4, seed=3, prompts_path=str(tmp_path / "p.txt"))
    (tmp_path / "p.txt").write_text("\n".join(users) + "\n")
    ordered = {u: d for u, d in zip(users, documents)}
    same = self_generated_documents(plain, tiny.tokenizer, tiny.model, tiny.identity_hash, tmp_path / "other")
    for document in same:  # the same prompts answered the same way, whichever way they came in
        user = document.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        assert ordered[user] == document
