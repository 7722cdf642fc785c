"""Self-generated chat calibration (``calibration=self_generated``): the shipped prompts, answers
equal to plain greedy decoding, a cache keyed by content, and a job that runs on it."""

from __future__ import annotations

import json

import pytest
from helpers.config import CACHE, compose_config, typed
from helpers.jobs import job_config
from helpers.self_generated import slimorca_file

from replaceme_exp.data.calibration import CALIBRATION_SOURCES
from replaceme_exp.data.generated import SHIPPED_PROMPTS, chosen_prompts, load_prompts
from replaceme_exp.errors import ConfigError
from replaceme_exp.runtime import run_recorded


def test_the_shipped_prompts_are_many_distinct_and_stay_off_the_evaluation():
    prompts = load_prompts(None)
    assert len(prompts) >= 256 and len({p.lower() for p in prompts}) == len(prompts)
    samples = [p.lower() for p in compose_config([]).eval.samples.prompts]
    for prompt in prompts:
        text = prompt.lower()
        assert not any(word in text for word in ("capital", "opposite", "antonym")), prompt
        assert text not in samples
    assert SHIPPED_PROMPTS.suffix == ".jsonl"


def test_prompt_files_and_their_errors(tmp_path):
    lines = tmp_path / "prompts.txt"
    lines.write_text("First question?\n\nSecond task.\n")
    assert load_prompts(str(lines)) == ["First question?", "Second task."]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(json.dumps({"prompt": "A"}) + "\n" + json.dumps({"text": "B"}) + "\n")
    with pytest.raises(ConfigError, match=r"calibration.prompts_path=.*line 2: no JSON prompt"):
        load_prompts(str(jsonl))
    with pytest.raises(ConfigError, match="calibration.n_samples=3: the prompt pool holds only 2 prompts"):
        chosen_prompts(["a", "b"], 3, 0)
    assert chosen_prompts(list("abcdef"), 3, 1) == chosen_prompts(list("abcdef"), 3, 1)


def test_bad_generation_settings_are_refused_before_loading(tmp_path):
    for override, message in (
        ("calibration.prompts_path=/no/such/x.jsonl", "calibration.prompts_path='/no/such/x.jsonl': no such file"),
        ("calibration.max_new_tokens=0", "calibration.max_new_tokens=0: must be a positive integer"),
        ("calibration.temperature=-1", "calibration.temperature=-1"),
    ):
        cfg = job_config(tmp_path, "calibration=self_generated", override)
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            run_recorded(cfg)


def test_orca_generated_refuses_a_missing_prompt_file(tmp_path):
    overrides = ["calibration=orca_generated", "calibration.prompts_dataset=json"]
    with pytest.raises(ConfigError) as err:
        run_recorded(job_config(tmp_path, *overrides, "calibration.prompts_data_files=/no/such.jsonl"))
    assert err.value.key == "calibration.prompts_data_files"


def test_aya_slimorca_mixes_slimorca_chats_with_aya_pairs(tmp_path):
    aya = tmp_path / "aya.jsonl"
    with open(aya, "w") as f:
        for i, language in enumerate(["French", "Swahili", "Hindi", "Turkish"]):
            f.write(json.dumps({"inputs": f"Prompt {i} in {language}", "targets": f"Answer {i}", "language": language}))
            f.write("\n")
    cfg = typed(["calibration=aya_slimorca"]).calibration
    assert cfg.parts["aya"]["dataset"] == "CohereForAI/aya_dataset"
    assert list(cfg.parts["aya"]["pair_fields"]) == ["inputs", "targets"]
    for part, file in (("slimorca", slimorca_file(tmp_path / "s.jsonl", 4)), ("aya", aya)):
        cfg.parts[part].update(dataset="json", path=str(file), streaming=False)
    from transformers import AutoTokenizer

    from replaceme_exp.models.embedded import embedded_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(embedded_checkpoint(str(CACHE)))
    documents = CALIBRATION_SOURCES.get(cfg.source).read(cfg, tokenizer, 6, 0, None)
    aya_docs = [d for d in documents if "Prompt " in d]
    assert len(documents) == 6 and len(aya_docs) == 3
    for d in aya_docs:
        i = d.split("Prompt ", 1)[1][0]
        turns = [{"role": "user", "content": d.split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]},
                 {"role": "assistant", "content": f"Answer {i}"}]  # fmt: skip
        assert d == tokenizer.apply_chat_template(turns, tokenize=False)
