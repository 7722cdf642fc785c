"""Held-out perplexity over many documents in two domains (eval.text=documents): the shipped documents,
their windows (none spans two documents), the cluster bootstrap over documents against one drawn cluster
by cluster, and what a row records."""

from __future__ import annotations

import hashlib
import json
import math
import re

import numpy as np
import pytest
from helpers.config import typed

from replaceme_exp.data.batching import document_windows
from replaceme_exp.data.heldout_documents import (
    ABSTRACTS,
    DOMAINS,
    MANIFEST,
    MIN_CHARS,
    build_abstracts,
    heldout_documents,
    pydoc_sections,
    readme_abstract,
)
from replaceme_exp.intervals import paired_perplexity, perplexity_interval, resampled_sums
from replaceme_exp.evaluation.perplexity import WindowPerplexity


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def eight_grams(text: str) -> set[tuple[str, ...]]:
    words = words_of(text)
    return {tuple(words[i : i + 8]) for i in range(len(words) - 7)}


class CharTokenizer:
    """One token per character (ids 10..), EOS 2, BOS 1."""

    eos_token_id, bos_token_id = 2, 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [10 + (ord(c) % 50) for c in text]}


def test_the_default_windows_rest_on_at_least_30_documents_of_two_domains():
    cfg = typed([]).eval
    assert cfg.text == "documents" and cfg.windows_per_document == 1
    taken = heldout_documents()[: cfg.max_windows]
    assert len({d.id for d in taken}) == cfg.max_windows >= 30
    by_domain = {domain: sum(d.domain == domain for d in taken) for domain in DOMAINS}
    assert by_domain == {"pydoc": cfg.max_windows // 2, "abstracts": cfg.max_windows // 2}
    assert all(len(d.text) >= MIN_CHARS for d in heldout_documents())
    ids = [d.id for d in heldout_documents()]
    assert len(ids) == len(set(ids)) and all(i.startswith(tuple(f"{d}:" for d in DOMAINS)) for i in ids)


def test_pydoc_sections_are_the_heldout_part_cut_at_headings():
    from replaceme_exp.data.sources import pydoc_text

    heldout, calibration = pydoc_text("heldout"), pydoc_text("calibration")
    sections = pydoc_sections()
    assert len(sections) > 30
    for section in sections:
        for paragraph in section.text.split("\n\n"):
            assert paragraph in heldout and paragraph not in calibration.split("\n\n")
    titled = [s for s in sections if "/" in s.id and s.id.split("/", 1)[1] == "Lists"]
    assert titled and titled[0].text.startswith("Lists\n*****") or titled[0].text.startswith("Lists\n")


def test_no_heldout_document_shares_an_eight_word_sequence_with_calibration_text_or_a_task_item():
    from replaceme_exp.data.generated import SHIPPED_ANSWERS, load_prompts
    from replaceme_exp.data.sources import CHAT_PROMPT, pydoc_text
    from replaceme_exp.evaluation.offline_items import MANIFEST as TASKS_MANIFEST
    from replaceme_exp.evaluation.offline_items import OFFLINE_TASKS, item_texts

    answers = [json.loads(line)["value"]["answers"] for line in SHIPPED_ANSWERS.read_text().splitlines()]
    calibration = [pydoc_text("calibration"), CHAT_PROMPT, *load_prompts(None), *(a for b in answers for a in b)]
    manifest = json.loads(TASKS_MANIFEST.read_text())
    items = [
        text
        for task, entry in manifest["tasks"].items()
        for line in (OFFLINE_TASKS / entry["file"]).read_text(encoding="utf-8").splitlines()
        for text in item_texts(task, json.loads(line))
    ]
    reference = set().union(*(eight_grams(t) for t in calibration + items))
    assert len(reference) > 50_000
    overlapping = [d.id for d in heldout_documents() if eight_grams(d.text) & reference]
    assert overlapping == []
    # the check finds a copied calibration sentence
    copied = next(p for p in pydoc_text("calibration").split("\n\n") if len(words_of(p)) > 12)
    assert eight_grams(copied) & reference


def test_the_shipped_abstracts_are_what_the_builder_reads_from_the_installed_lm_eval():
    from importlib.metadata import version
    from pathlib import Path

    import lm_eval

    manifest = json.loads(MANIFEST.read_text())
    data = ABSTRACTS.read_bytes()
    assert hashlib.sha256(data).hexdigest() == manifest["abstracts"]["sha256"]
    assert manifest["licences"]["abstracts"].startswith("MIT")
    records = [json.loads(line) for line in data.decode().splitlines()]
    assert len(records) == manifest["abstracts"]["documents"] >= 60
    if version("lm_eval") == manifest["sources"]["lm_eval"]:
        assert build_abstracts(Path(lm_eval.__file__).parent / "tasks") == records


def test_a_readme_abstract_is_its_prose_without_links_code_or_markup():
    readme = (
        "# Task\n\n### Paper\n\nTitle: `A`\n\nAbstract: https://arxiv.org/abs/1\n\n"
        "We present a **new** benchmark of `questions` that probes what a language model knows about the "
        "world and how it reasons about it.\n> It is hard.\n\nSee [here](http://x) for the data and more of it "
        "than you want to read today in one sitting.\n\nHomepage: `https://x`\n\nMore prose after the homepage "
        "that is not part of the abstract at all, and is long enough.\n"
    )
    found = readme_abstract(readme)
    assert found == (
        "We present a new benchmark of questions that probes what a language model knows about the world and "
        "how it reasons about it. It is hard."
    )
    assert readme_abstract("# Task\n\nNo abstract here.\n") is None


def test_document_windows_never_span_two_documents():
    tok = CharTokenizer()
    documents = [("a:1", "x" * 40), ("b:1", "y" * 5), ("a:2", "z" * 31), ("b:2", "w" * 100)]
    batches = document_windows(documents, tok, seq_len=16, max_windows=6, windows_per_document=2, batch_size=4)
    rows = [(row, mask) for b in batches for row, mask in zip(b.input_ids.tolist(), b.attention_mask.tolist())]
    texts = [[t for t, m in zip(row, mask) if m][1:] for row, mask in rows]
    # a:1 gives two full windows of 15 text tokens; b:1 one short (5 + EOS, padded); a:2 two (31 + EOS = 32:
    # 15 + 15, its last 2 tokens dropped); b:2 one more, cut at max_windows
    assert batches.documents == ["a:1", "a:1", "b:1", "a:2", "a:2", "b:2"]
    assert [len(t) for t in texts] == [15, 15, 6, 15, 15, 15]
    assert all(row[0] == tok.bos_token_id for row, _ in rows)
    for text, owner in zip(texts, batches.documents):
        source = dict(documents)[owner]
        stream = tok(source)["input_ids"] + [tok.eos_token_id]
        assert any(stream[i : i + len(text)] == text for i in range(0, len(stream), 15))
    one = document_windows(documents, tok, seq_len=16, max_windows=10, windows_per_document=1, batch_size=4)
    assert one.documents == ["a:1", "b:1", "a:2", "b:2"]
    assert (
        one.content_hash()
        != document_windows(
            documents[::-1], tok, seq_len=16, max_windows=10, windows_per_document=1, batch_size=4
        ).content_hash()
    )


def clustered_windows(n_documents: int, per_document: int, seed: int):
    """Windows whose losses share their document's level (topic), as adjacent windows of one text do."""
    rng = np.random.default_rng(seed)
    level = rng.gamma(shape=8.0, scale=0.4, size=n_documents)
    nll, tokens, documents = [], [], []
    for d in range(n_documents):
        for _ in range(per_document):
            t = float(rng.integers(100, 256))
            nll.append((level[d] + rng.normal(0, 0.05)) * t)
            tokens.append(t)
            documents.append(f"doc{d}")
    return np.asarray(nll), np.asarray(tokens), documents


def test_the_cluster_bootstrap_agrees_with_one_drawn_document_by_document():
    nll, tokens, documents = clustered_windows(24, 3, seed=1)
    low, high = perplexity_interval(nll, tokens, resamples=20000, seed=3, clusters=documents)
    names = sorted(set(documents))
    rng = np.random.default_rng(4)
    values = []
    for _ in range(20000):
        drawn = rng.choice(names, size=len(names), replace=True)
        idx = [i for name in drawn for i, d in enumerate(documents) if d == name]
        values.append(math.exp(nll[idx].sum() / tokens[idx].sum()))
    ref_low, ref_high = np.quantile(values, [0.025, 0.975])
    assert low == pytest.approx(ref_low, rel=0.01) and high == pytest.approx(ref_high, rel=0.01)
    # windows of one document move together: resampling windows alone understates the spread
    w_low, w_high = perplexity_interval(nll, tokens, resamples=20000, seed=3)
    assert (high / low) > 1.3 * (w_high / w_low)


def test_resampled_sums_by_cluster_keep_a_cluster_whole():
    values = np.stack([np.ones(6), np.arange(6.0)])
    sums = resampled_sums(values, resamples=200, seed=0, clusters=["a", "a", "b", "b", "b", "c"])
    # every resample draws 3 clusters of sizes 2, 3 or 1: the unit counts are sums of three of them
    assert set(np.unique(sums[:, 0])) <= {a + b + c for a in (1, 2, 3) for b in (1, 2, 3) for c in (1, 2, 3)}
    with pytest.raises(ValueError, match="cluster labels"):
        resampled_sums(values, clusters=["a"])


def test_a_paired_comparison_draws_documents_when_the_windows_name_them():
    nll, tokens, documents = clustered_windows(20, 3, seed=2)
    worse = nll * 1.02 + np.random.default_rng(5).normal(0, 2.0, len(nll)) * np.repeat(
        np.random.default_rng(6).normal(0, 1, 20), 3
    )
    by_document = paired_perplexity(worse, nll, tokens, clusters=documents)
    by_window = paired_perplexity(worse, nll, tokens)
    assert by_document.method == "paired bootstrap over documents" and by_document.units == 20
    assert by_document.estimate == pytest.approx(by_window.estimate)
    assert (by_document.high - by_document.low) > (by_window.high - by_window.low)


def test_a_rows_perplexity_columns_say_what_they_rest_on():
    nll, tokens, documents = clustered_windows(6, 2, seed=3)
    documents = [f"pydoc:{d}" if i < 6 else f"abstracts:{d}" for i, d in enumerate(documents)]
    measured = WindowPerplexity(nll, tokens, "h", tuple(documents))
    columns = {**measured.columns("ppl_heldout"), **measured.unit_columns()}
    assert columns["ppl_heldout_documents"] == 6 and columns["ppl_heldout_tokens"] == int(tokens.sum())
    assert columns["ppl_heldout_domains"] == {"pydoc": 3, "abstracts": 3}
    assert "over documents" in columns["ppl_heldout_interval"]
    low, high = perplexity_interval(nll, tokens, clusters=documents)
    assert (columns["ppl_heldout_ci_low"], columns["ppl_heldout_ci_high"]) == (low, high)
    alone = WindowPerplexity(nll, tokens, "h").unit_columns()
    assert alone["ppl_heldout_documents"] is None and "over windows" in alone["ppl_heldout_interval"]
