"""Calibration batches under ``protocol=official`` against the official loader (ReplaceMe/utils.py,
get_calib_dataloader) written out by hand over the same records: the SlimOrca + FineWeb mix
(``_load_mixed_dataset``: the first ``size // 2`` SlimOrca dialogs, then the first ``size - size // 2``
FineWeb texts, concatenated) and WikiText-2's empty lines (kept: ``data.select(range(n))`` filters
nothing), batched by ``DataLoader(shuffle=False, drop_last=True)`` and tokenised per batch with
``padding="longest"``. The hub datasets are prepared copies in a test's own offline cache, so the
project's real loading code reads them."""

from __future__ import annotations

import pytest
import torch
from helpers.config import CACHE, compose_config
from helpers.hub_cache import cache_hub_dataset, empty_offline_cache

from replaceme_exp.data import build_calibration
from replaceme_exp.pipeline.spec import JobSpec


SEQ_LEN = 48


@pytest.fixture
def hf_cache(monkeypatch, tmp_path):
    return empty_offline_cache(monkeypatch, tmp_path / "hf")


@pytest.fixture(scope="module")
def bos_tokenizer():
    """SmolLM2's tokenizer set to add a BOS token, as the paper's models' tokenizers do (Llama 3:
    ``<|begin_of_text|>``): an empty record then tokenises to a BOS-only sequence."""
    from transformers import AutoTokenizer

    from replaceme_exp.models.embedded import embedded_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(embedded_checkpoint(CACHE), add_bos_token=True)
    assert tokenizer("")["input_ids"] == [tokenizer.bos_token_id]
    return tokenizer


def spec(*overrides) -> JobSpec:
    return JobSpec.from_config(
        compose_config([f"calibration.seq_len={SEQ_LEN}", "calibration.batch_size=2", *overrides])
    )


def official_batches(texts: list[str], batch_size: int, tokenizer) -> list[dict]:
    """utils.get_calib_dataloader's DataLoader(texts, batch_size, shuffle=False, drop_last=True),
    each batch tokenised as cosine_dist.py / lstsq.py do."""
    whole = len(texts) - len(texts) % batch_size
    return [
        tokenizer(
            texts[i : i + batch_size], return_tensors="pt", padding="longest", max_length=SEQ_LEN, truncation=True
        )
        for i in range(0, whole, batch_size)
    ]


def orca_text(record: dict, tokenizer) -> str:
    """utils._load_orca_dataset's text of one SlimOrca record."""
    turns = record["conversations"]
    idx = 0 if turns[0]["from"] == "human" else 1
    dialog = [
        {"role": "user", "content": turns[idx]["value"]},
        {"role": "assistant", "content": turns[idx + 1]["value"]},
    ]
    return tokenizer.apply_chat_template(dialog, tokenize=False)


def assert_same_batches(ours, expected) -> None:
    assert len(ours) == len(expected)
    for batch, official in zip(ours, expected):
        assert torch.equal(batch.input_ids, official["input_ids"])
        assert torch.equal(batch.attention_mask, official["attention_mask"])


def test_the_slimorca_fineweb_mix_is_the_slimorca_half_then_the_fineweb_half_batched_in_order(
    hf_cache, smollm2_tokenizer
):
    orca = [
        {
            "conversations": [
                {"from": "system", "value": "You are an AI assistant."},
                {"from": "human", "value": f"Question {i}: " + "why? " * i},
                {"from": "gpt", "value": f"Answer {i}."},
                {"from": "human", "value": "A follow-up."},
                {"from": "gpt", "value": "A second answer."},
            ]
        }
        for i in range(10)
    ]
    fineweb = [{"text": f"Web page {i}. " + "More web text. " * (i % 4), "id": str(i)} for i in range(10)]
    cache_hub_dataset(hf_cache, "Open-Orca/SlimOrca", "default", orca)
    cache_hub_dataset(hf_cache, "HuggingFaceFW/fineweb", "sample-10BT", fineweb)
    local = [f"calibration.parts.{p}.streaming=false" for p in ("slimorca", "fineweb")]  # a prepared copy
    n, batch_size = 7, 2  # (the spec's batch size) 3 dialogs then 4 web texts; the last, incomplete batch dropped
    official = spec("calibration=slimorca_fineweb", "protocol=official", f"calibration.n_samples={n}", *local)
    cfg = official.config.calibration
    assert (cfg.mix_order, cfg.batch_order, cfg.drop_last) == ("concatenated", "as_read", True)
    texts = [orca_text(r, smollm2_tokenizer) for r in orca[: n // 2]] + [r["text"] for r in fineweb[: n - n // 2]]
    assert_same_batches(
        build_calibration(cfg, smollm2_tokenizer), official_batches(texts, batch_size, smollm2_tokenizer)
    )
    assert official.setting_columns()["calibration_mix_order"] == "concatenated"
    paper = spec("calibration=slimorca_fineweb", f"calibration.n_samples={n}", *local)
    assert paper.config.calibration.mix_order == "shuffled"
    assert paper.setting_columns()["calibration_mix_order"] == "shuffled"
    assert spec("calibration=slimorca").setting_columns()["calibration_mix_order"] is None


def test_wikitext_keeps_its_empty_lines_under_protocol_official(hf_cache, bos_tokenizer):
    lines = ["", " = Valkyria Chronicles III = \n", "", " Senjo no Valkyria 3 is a game . \n", " It was released . \n"]
    lines += ["", " = = Gameplay = = \n", "", " The game is tactical . \n", " It has battles . \n"]
    cache_hub_dataset(hf_cache, "wikitext", "wikitext-2-raw-v1", [{"text": line} for line in lines])
    n, batch_size = 9, 2  # (the spec's batch size)
    official = spec("calibration=wikitext2", "protocol=official", f"calibration.n_samples={n}")
    cfg = official.config.calibration
    assert (cfg.order, cfg.empty_records) == ("first", "keep")
    batches = build_calibration(cfg, bos_tokenizer)
    assert_same_batches(batches, official_batches(lines[:n], batch_size, bos_tokenizer))
    assert sum(int(m.sum()) == 1 for b in batches for m in b.attention_mask) == 4  # four empty lines: BOS only
    assert official.setting_columns()["calibration_empty_records"] == "keep"
    paper = spec("calibration=wikitext2", f"calibration.n_samples={n}", "calibration.order=first")
    assert paper.config.calibration.empty_records == "drop"
    assert paper.setting_columns()["calibration_empty_records"] == "drop"
    kept = [line for line in lines[:n] if line.strip()]
    paper_batches = build_calibration(paper.config.calibration, bos_tokenizer)
    assert paper_batches.n_sequences == len(kept) and all(int(b.attention_mask.sum(1).min()) > 1 for b in paper_batches)
    # a chat dataset's records are never empty: the setting cannot act, the row says None
    assert spec("calibration=slimorca", "protocol=official").setting_columns()["calibration_empty_records"] is None
