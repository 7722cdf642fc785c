"""Numbers a researcher can trust: equivalent spellings hash equal, caches keyed by weights
content and code semantics, cached stages recorded, the official pipeline's preset and loader,
masking as augmentation, the 4-bit option's refusal, CodeCarbon on the job's own GPUs."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config, config_hash, setting_hash, typed
from helpers.jobs import SMOKE, job_config

from replaceme_exp.data.augmentation import with_masked_copies
from replaceme_exp.data.sources import first_pair
from replaceme_exp.errors import ConfigError
from replaceme_exp.models.fingerprint import directory_digest, file_digest
from replaceme_exp.runtime import run_recorded
from replaceme_exp.tracking.emissions import job_gpu_ids


@pytest.mark.parametrize(
    "spellings",
    [
        (["alpha=0"], ["alpha=0.0"], []),
        (["experiment=uidl_baseline"], ["objective=identity", "selection=uidl"]),
        (["regularizer=none"], ["regularizer=l2", "alpha=0"]),
        (["objective=identity", "alpha=5"], ["objective=identity", "structure=diagonal"]),
        (["cuts=[[2,4]]", "selection=l2"], ["cuts=[[2,4]]", "n_prune=4"]),
        (["mask_ratio=0", "mask_passes=3"], []),
    ],
)
def test_equivalent_spellings_hash_equal(spellings):
    hashes = {config_hash(compose_config(SMOKE + list(s))) for s in spellings}
    assert len(hashes) == 1


@pytest.mark.parametrize(
    "one, other",
    [
        ([], ["alpha=1"]),
        ([], ["seed=1"]),
        ([], ["objective=identity"]),
        ([], ["mask_ratio=0.25"]),
        # identity fuses nothing, but ls_residual selection solves ridge in the given placement
        (["objective=identity", "selection=ls_residual"], ["objective=identity", "selection=ls_residual", "alpha=10"]),
        (
            ["objective=identity", "selection=ls_residual"],
            ["objective=identity", "selection=ls_residual", "lt_placement=separate"],
        ),
    ],
)
def test_different_settings_hash_apart(one, other):
    assert config_hash(compose_config(SMOKE + one)) != config_hash(compose_config(SMOKE + other))


def test_a_local_data_file_enters_the_hash_by_content(tmp_path):
    data = tmp_path / "calib.txt"
    data.write_text("first version\n\nof the text")
    overrides = ["calibration=text_file", f"calibration.path={data}", f"cache_dir={tmp_path}/c"]
    cfg = lambda: compose_config(SMOKE + overrides)  # noqa: E731
    before = config_hash(cfg())
    data.write_text("second version\n\nof the text")
    assert config_hash(cfg()) != before


def test_setting_hash_ignores_only_the_seed():
    base = compose_config(SMOKE)
    assert setting_hash(base) == setting_hash(compose_config(SMOKE + ["seed=7"]))
    assert setting_hash(base) != setting_hash(compose_config(SMOKE + ["alpha=1"]))
    assert setting_hash(base) != setting_hash(compose_config(SMOKE + ["model.dtype=bfloat16"]))


def test_file_digest_follows_content_not_path(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"a" * 100)
    memo = tmp_path / "memo"
    first = file_digest(f, memo)
    assert file_digest(f, memo) == first and len(list(memo.iterdir())) == 1
    f.write_bytes(b"b" * 100)  # replaced in place: same path, same size
    assert file_digest(f, memo) != first
    assert directory_digest(tmp_path, memo) != directory_digest(tmp_path / "memo", memo)


def test_masked_copies_are_seeded_keep_positions_and_never_hide_the_first_token():
    batches = batches_of(random_sequences(6, 10, 30, seed=3), 3)
    a = with_masked_copies(batches, 0.3, 2, seed=5)
    b = with_masked_copies(batches, 0.3, 2, seed=5)
    c = with_masked_copies(batches, 0.3, 2, seed=6)
    assert len(a) == 3 * len(batches) and a.content_hash() == b.content_hash() != c.content_hash()
    assert a.content_hash() != batches.content_hash()
    for plain, masked in zip(batches, list(a)[len(batches) :]):
        mask, hidden = plain.attention_mask.bool(), masked.attention_mask.bool()
        assert not (hidden & ~mask).any()  # padding stays padding
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        assert masked.position_ids.equal(positions)
        assert hidden[mask & (positions == 0)].all()  # the first token of each sequence is kept
        dropped = (mask & ~hidden).sum().item() / mask.sum().item()
        assert 0.1 < dropped < 0.5
    with pytest.raises(ConfigError, match="mask_ratio"):
        with_masked_copies(batches, 1.0, 1, 0)
    with pytest.raises(ConfigError, match="mask_passes"):
        with_masked_copies(batches, 0.5, 0, 0)


def test_official_slimorca_loader_takes_the_first_records_and_their_first_pair(tmp_path, smollm2_tokenizer):
    from replaceme_exp.data import build_calibration

    path = tmp_path / "orca.jsonl"
    records = [
        {
            "conversations": [
                {"from": "system", "value": "You are an AI assistant."},
                {"from": "human", "value": f"Question {i}?"},
                {"from": "gpt", "value": f"Answer {i}."},
                {"from": "human", "value": "A follow-up."},
                {"from": "gpt", "value": "A second answer."},
            ]
        }
        for i in range(10)
    ]
    path.write_text("\n".join(json.dumps(r) for r in records))
    cfg = typed(
        ["calibration=jsonl", f"calibration.path={path}", "calibration.chat_field=conversations"]
        + ["calibration.order=first", "calibration.chat_turns=first_pair", "calibration.n_samples=4"]
    ).calibration
    decoded = [
        smollm2_tokenizer.decode(ids[m.bool()])
        for b in build_calibration(cfg, smollm2_tokenizer)
        for ids, m in zip(b.input_ids, b.attention_mask)
    ]
    assert sorted(d.split("Question ")[1][0] for d in decoded) == ["0", "1", "2", "3"]  # the first four, in order
    assert all("follow-up" not in d and "You are an AI assistant" not in d for d in decoded)
    assert first_pair([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])[1]["content"] == "b"
    shuffled = typed(["calibration=jsonl", f"calibration.path={path}", "calibration.chat_field=conversations"])
    assert shuffled.calibration.order == "shuffled" and shuffled.calibration.chat_turns == "all"
    official = compose_config(["calibration=slimorca_official"]).calibration
    settings = (official.order, official.chat_turns, official.n_samples, official.seq_len)
    assert settings == ("first", "first_pair", 8000, 1024)


def test_nf4_capture_is_refused_clearly_without_bitsandbytes_or_a_gpu(tmp_path):
    row = run_recorded(job_config(tmp_path, "model.capture_4bit=true"), raise_on_failure=False)
    assert row["status"] == "failed" and row["error"].startswith("ConfigError: model.capture_4bit=True")
    if not torch.cuda.is_available():
        cfg = typed(["model=llama3_8b_instruct", "model.capture_4bit=true"])
        from replaceme_exp.models.loading import check_nf4_capture

        with pytest.raises(ConfigError, match="model.capture_4bit"):
            check_nf4_capture(cfg.model)


def test_codecarbon_measures_the_jobs_own_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert job_gpu_ids("auto", None, False, 0) is None
    assert job_gpu_ids("cuda:2", None, True, 4) == [2]
    assert job_gpu_ids("auto", "auto", True, 3) == [0, 1, 2]
    assert job_gpu_ids("cpu", None, True, 2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert job_gpu_ids("cuda:1", None, True, 2) == [6]
    assert job_gpu_ids("auto", "auto", True, 2) == [4, 6]


def test_the_official_codes_calibration_datasets_have_presets():
    """utils.get_calib_dataloader of the official code: C4 (en), WikiText-2 (raw v1) and
    sec-data-mini, each read from its "text" column."""
    official = {
        "c4": ("allenai/c4", "en"),
        "wikitext2": ("wikitext", "wikitext-2-raw-v1"),
        "sec_data_mini": ("arcee-ai/sec-data-mini", None),
    }
    for name, (dataset, subset) in official.items():
        calibration = compose_config([f"calibration={name}", "calibration.order=first"]).calibration
        assert (calibration.dataset, calibration.subset, calibration.text_field) == (dataset, subset, "text"), name
        assert calibration.source == "hf_dataset" and calibration.order == "first"
