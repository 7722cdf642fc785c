"""Calibration sources: pydoc split, pydoc as chats, user text files, JSONL with text or chat records."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from replaceme_exp.config import schema
from replaceme_exp.config.validate import build, build_option
from replaceme_exp.data import build_calibration, heldout_windows
from replaceme_exp.data.calibration import CALIBRATION_SOURCES, as_read_by
from replaceme_exp.data.sources import CHAT_PROMPT, document_as_chat, pydoc_text
from replaceme_exp.errors import ConfigError


def calib_cfg(**kw):
    """A typed calibration option (the shape its keys make, as a composed config gets)."""
    base = dict(name="t", source="pydoc", n_samples=8, seq_len=64, batch_size=3, padding_side="right", seed=0)
    base.update(kw)
    return as_read_by(build_option("calibration", base, "calibration"), "paper")


def calibration_documents(cfg, tokenizer, n, seed, answerer=None):
    """The documents the configured source reads (the registry's reader)."""
    return CALIBRATION_SOURCES.get(cfg.source).read(cfg, tokenizer, n, seed, answerer)


def test_pydoc_calibration_and_heldout_text_are_disjoint():
    calibration, heldout = pydoc_text("calibration"), pydoc_text("heldout")
    assert len(heldout) > 50_000 and len(calibration) > 4 * len(heldout) * 0.9
    calibration_paragraphs = set(calibration.split("\n\n"))
    heldout_paragraphs = set(heldout.split("\n\n"))
    assert len(heldout_paragraphs) > 300 and not heldout_paragraphs & calibration_paragraphs


def test_pydoc_batches_are_padded_reproducible_and_seeded(smollm2_tokenizer):
    a = build_calibration(calib_cfg(), smollm2_tokenizer)
    b = build_calibration(calib_cfg(), smollm2_tokenizer)
    c = build_calibration(calib_cfg(seed=1), smollm2_tokenizer)
    assert a.n_sequences == 8 and len(a) == 3
    assert a.content_hash() == b.content_hash() != c.content_hash()
    assert all(batch.input_ids.shape[1] <= 64 for batch in a)
    # Paragraph tails are shorter than seq_len: real padding, masked out of the token count.
    assert any((batch.attention_mask == 0).any() for batch in a) and a.n_tokens < 8 * 64


def test_text_file_calibration(tmp_path, smollm2_tokenizer):
    path = tmp_path / "mine.txt"
    path.write_text("\n\n".join(f"Paragraph {i} about pruning transformer blocks. " * 5 for i in range(40)))
    batches = build_calibration(calib_cfg(source="text_file", path=str(path), n_samples=10), smollm2_tokenizer)
    assert batches.n_sequences == 10
    text = smollm2_tokenizer.decode(batches.batches[0].input_ids[0])
    assert "pruning transformer blocks" in text


@pytest.mark.parametrize(
    "content, key, message",
    [
        (None, "calibration.path", "no such file"),
        ("", "calibration.path", "holds no text"),
        ("one short line", "calibration.n_samples", "only 1 documents"),
    ],
)
def test_bad_text_files_name_the_key(tmp_path, smollm2_tokenizer, content, key, message):
    path = tmp_path / "f.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message) as err:
        build_calibration(calib_cfg(source="text_file", path=str(path)), smollm2_tokenizer)
    assert err.value.key == key


def test_jsonl_text_and_chat_records(tmp_path, smollm2_tokenizer):
    path = tmp_path / "calib.jsonl"
    records = [{"text": f"plain record number {i} " * 4} for i in range(6)]
    records += [
        {"messages": [{"role": "user", "content": f"What is block {i}?"}, {"role": "assistant", "content": "A layer."}]}
        for i in range(3)
    ]
    path.write_text("\n".join(json.dumps(r) for r in records))
    cfg = calib_cfg(
        source="hf_dataset", dataset="json", path=str(path), text_field="text", chat_field="messages", n_samples=9
    )
    batches = build_calibration(cfg, smollm2_tokenizer)
    decoded = [
        smollm2_tokenizer.decode(ids[m.bool()]) for b in batches for ids, m in zip(b.input_ids, b.attention_mask)
    ]
    assert sum("plain record number" in d for d in decoded) == 6
    chats = [d for d in decoded if "What is block" in d]
    assert len(chats) == 3 and all("<|im_start|>user" in d and "<|im_start|>assistant" in d for d in chats)

    sharegpt = tmp_path / "orca.jsonl"
    sharegpt.write_text(
        json.dumps({"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}]})
    )
    cfg = calib_cfg(
        source="hf_dataset",
        dataset="json",
        path=str(sharegpt),
        text_field=None,
        chat_field="conversations",
        n_samples=1,
    )
    (text,) = [smollm2_tokenizer.decode(b.input_ids[0]) for b in build_calibration(cfg, smollm2_tokenizer)]
    assert "<|im_start|>user\nHi there" in text and "<|im_start|>assistant\nHello!" in text


def test_record_without_text_or_chat_names_the_field(tmp_path, smollm2_tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"body": "x"}))
    cfg = calib_cfg(
        source="hf_dataset", dataset="json", path=str(path), text_field="text", chat_field="messages", n_samples=1
    )
    with pytest.raises(ConfigError, match="calibration.text_field='text'.*keys: \\['body'\\]"):
        build_calibration(cfg, smollm2_tokenizer)


def test_missing_jsonl_names_the_path(tmp_path, smollm2_tokenizer):
    cfg = calib_cfg(source="hf_dataset", dataset="json", path=str(tmp_path / "nope.jsonl"), text_field="text")
    with pytest.raises(ConfigError, match="calibration.path.*no such file"):
        build_calibration(cfg, smollm2_tokenizer)


def test_heldout_windows_are_full(smollm2_tokenizer):
    cfg = build(schema.EvalConfig, dict(name="quick", text="pydoc_heldout", seq_len=32, max_windows=5, batch_size=2))
    windows = heldout_windows(cfg, smollm2_tokenizer)
    assert windows.n_sequences == 5 and windows.n_tokens == 5 * 32


def test_text_template_renders_sciq_style_records_and_names_a_missing_field(tmp_path, smollm2_tokenizer):
    path = tmp_path / "sciq.jsonl"
    records = [
        {
            "question": f"What is {i}?",
            "correct_answer": f"answer {i}",
            "support": f"Support text {i}.",
            "distractor1": "x",
        }
        for i in range(4)
    ]
    path.write_text("\n".join(json.dumps(r) for r in records))
    template = "{support}\nQuestion: {question}\nAnswer: {correct_answer}"
    cfg = calib_cfg(source="hf_dataset", dataset="json", path=str(path), text_template=template, n_samples=4)
    decoded = [
        smollm2_tokenizer.decode(ids[m.bool()])
        for b in build_calibration(cfg, smollm2_tokenizer)
        for ids, m in zip(b.input_ids, b.attention_mask)
    ]
    for i in range(4):
        assert f"Support text {i}.\nQuestion: What is {i}?\nAnswer: answer {i}" in "\n".join(decoded)
    bad = calib_cfg(source="hf_dataset", dataset="json", path=str(path), text_template="{solution}", n_samples=1)
    with pytest.raises(ConfigError, match="calibration.text_template='\\{solution\\}'.*'solution'"):
        build_calibration(bad, smollm2_tokenizer)


def test_pydoc_chat_documents_are_the_pydoc_documents_rendered_as_chats(smollm2_tokenizer):
    plain = calibration_documents(calib_cfg(n_samples=24), smollm2_tokenizer, 24, seed=0)
    chats = calibration_documents(calib_cfg(source="pydoc_chat", n_samples=24), smollm2_tokenizer, 24, seed=0)
    assert len(chats) == len(plain) == 24
    kinds = set()
    for document, chat in zip(plain, chats):
        parts = re.split(r"\n\s*\n", document, maxsplit=1)
        user, assistant = parts if len(parts) == 2 else (CHAT_PROMPT, parts[0])
        kinds.add(len(parts))
        assert chat.index(f"<|im_start|>user\n{user}<|im_end|>") < chat.index(f"<|im_start|>assistant\n{assistant}")
    assert kinds == {1, 2}  # both documents of several paragraphs and single paragraphs were drawn
    # Without a chat template: the "role: content" fallback of render_record.
    no_template = SimpleNamespace(chat_template=None)
    assert document_as_chat("Title\n\nBody one.\n\nBody two.", no_template) == (
        "user: Title\n\nassistant: Body one.\n\nBody two."
    )
    assert document_as_chat("Alone.", no_template) == f"user: {CHAT_PROMPT}\n\nassistant: Alone."


def test_pydoc_chat_is_seeded_and_respects_n_samples(smollm2_tokenizer):
    def draw(n, seed):
        return calibration_documents(calib_cfg(source="pydoc_chat", n_samples=n), smollm2_tokenizer, n, seed)

    assert draw(10, 0) == draw(10, 0) != draw(10, 1)
    assert len(draw(3, 0)) == 3 and draw(3, 0) == draw(10, 0)[:3]
    with pytest.raises(ConfigError, match="pydoc_chat source holds only") as err:
        draw(10**6, 0)
    assert err.value.key == "calibration.n_samples"
    with pytest.raises(ConfigError, match="choose one of .*pydoc, pydoc_chat, text_file") as err:
        calibration_documents(calib_cfg(source="chat"), smollm2_tokenizer, 1, 0)
    assert err.value.key == "calibration.source"


def test_pydoc_chat_config_composes_and_batches_start_with_the_template(smollm2_tokenizer):
    from helpers.config import typed

    sizes = ["calibration.n_samples=6", "calibration.seq_len=64", "calibration.batch_size=4"]
    cfg = typed(["calibration=pydoc_chat", *sizes]).calibration
    assert cfg.name == "pydoc_chat" and cfg.source == "pydoc_chat"
    batches = build_calibration(cfg, smollm2_tokenizer)
    assert batches.n_sequences == 6 and len(batches) == 2
    rendered = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    first = smollm2_tokenizer(rendered, add_special_tokens=True)["input_ids"][0]
    assert first == smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    for batch in batches:
        for ids, mask in zip(batch.input_ids, batch.attention_mask):
            assert ids[mask.bool()][0] == first
