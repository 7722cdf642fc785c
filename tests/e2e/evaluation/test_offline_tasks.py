"""The offline lm-eval tasks (replaceme_exp/evaluation/offline_items.py, docs/guides/offline-tasks.md):
the shipped items are what the builder writes from the installed sources, each item is true to its
source (read here without the builder's code), no item shares an 8-word sequence with any offline
calibration text or the held-out perplexity text, the suites use them, and lm-eval scores them as
the task files say (checked against log-likelihoods computed here)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest
import torch
from helpers.config import CACHE, typed
from helpers.offline_tasks import MANIFEST, TASKS, loglikelihood, shipped

from replaceme_exp.evaluation.harness import materialize_offline_tasks


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def eight_grams(text: str) -> set[tuple[str, ...]]:
    words = words_of(text)
    return {tuple(words[i : i + 8]) for i in range(len(words) - 7)}


def calibration_texts(tokenizer) -> list[str]:
    """The offline calibration sets as the sources produce them (every document any seed may draw)
    and the held-out perplexity text: pydoc and pydoc_chat (in SmolLM2's chat template; healing's
    pydoc data is the same text), the
    self-generated prompts and the shipped answers (self_generated; orca_generated offline without a
    prompts file answers the same prompts), the held-out pydoc windows' text and the rolling
    perplexity task's documents."""
    from replaceme_exp.data.calibration import CHARS_PER_TOKEN
    from replaceme_exp.data.generated import SHIPPED_ANSWERS, load_prompts
    from replaceme_exp.data.sources import document_as_chat, pydoc_documents, pydoc_text

    # documents pack whole paragraphs, joined as in the whole text: its sequences are every packing's
    documents = pydoc_documents("calibration", 256 * CHARS_PER_TOKEN)  # as calibration=pydoc packs them
    answers = [json.loads(line)["value"]["answers"] for line in SHIPPED_ANSWERS.read_text().splitlines()]
    return [
        pydoc_text("calibration"),
        *documents,
        *(document_as_chat(d, tokenizer) for d in documents),
        *load_prompts(None),
        *(a for batch in answers for a in batch),
        pydoc_text("heldout"),
    ]


def item_texts(task: str, item: dict) -> list[str]:
    if task == "replaceme_world_mc":
        return [f"Question: {item['question']}\nAnswer: {item['choices'][item['answer']]}", *item["choices"]]
    if task == "replaceme_doc_cloze":
        return [f"{item['context']} {item['target']}"]
    return [item["good"], item["bad"]]


@pytest.mark.slow
def test_no_item_shares_an_eight_word_sequence_with_calibration_or_heldout_text(smollm2_tokenizer, tmp_path):
    """Eight words: a shorter run (five to seven words) also matches the stock phrases both kinds
    of documentation share ("if the optional argument is", "return a new list of the"), a longer
    one would miss a copied sentence of eight to twelve words, the length of many docstring
    sentences."""
    reference = set()
    for text in calibration_texts(smollm2_tokenizer):
        reference |= eight_grams(text)
    rolling = materialize_offline_tasks(tmp_path / "tasks") / "pydoc_ppl.jsonl"
    for line in rolling.read_text().splitlines():
        reference |= eight_grams(json.loads(line)["text"])
    assert len(reference) > 50_000
    found = {
        task: [item for item in shipped(task) if any(eight_grams(t) & reference for t in item_texts(task, item))]
        for task in TASKS
    }
    assert found == {task: [] for task in TASKS}
    # the check finds a copied held-out sentence, and the builder had dropped such items
    from replaceme_exp.data.sources import pydoc_text

    copied = next(p for p in pydoc_text("heldout").split("\n\n") if len(words_of(p)) > 12)
    assert eight_grams(copied) & reference
    assert all(MANIFEST["tasks"][t]["dropped_overlap"] >= 0 for t in TASKS)
    assert MANIFEST["tasks"]["replaceme_doc_cloze"]["dropped_overlap"] > 0


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM

    from replaceme_exp.models.embedded import embedded_checkpoint

    return AutoModelForCausalLM.from_pretrained(embedded_checkpoint(CACHE), dtype=torch.float32).eval()


@pytest.mark.slow
def test_lm_eval_scores_each_task_as_its_file_says(smollm2, smollm2_tokenizer, tmp_path):
    """The quick suite's first items through lm-eval (the project's run_harness) on the real SmolLM2
    give the accuracies computed here from the items and the model's log-likelihoods (a random tiny
    model never continues a cloze greedily: it could not tell a wrong target from a right one)."""
    from replaceme_exp.evaluation.harness import run_harness

    n, model, tok = 8, smollm2, smollm2_tokenizer
    h = typed(["eval=quick", f"eval.harness.limit={n}"]).eval.harness
    scores = run_harness(model, tok, h, tmp_path)
    right, margins = Counter(), []
    for item in shipped("replaceme_world_mc")[:n]:
        context = f"Question: {item['question']}\nAnswer:"
        lls = [loglikelihood(model, tok, context, f" {c}")[0] for c in item["choices"]]
        right["replaceme_world_mc"] += max(range(4), key=lambda i: lls[i]) == item["answer"]
        margins.append(sorted(lls)[-1] - sorted(lls)[-2])
    for item in shipped("replaceme_doc_cloze")[:n]:
        right["replaceme_doc_cloze"] += loglikelihood(model, tok, item["context"], f" {item['target']}")[1]
    for item in shipped("replaceme_doc_pairs")[:n]:
        good, bad = (loglikelihood(model, tok, "", f" {s}")[0] for s in (item["good"], item["bad"]))
        right["replaceme_doc_pairs"] += good > bad
        margins.append(abs(good - bad))
    assert min(margins) > 1e-3  # no near tie that rounding in lm-eval's padded batches could flip
    # a wrong target (no space before the cloze word, the corrupted sentence as the answer) would show
    assert 0 < right["replaceme_doc_cloze"] < n and right["replaceme_doc_pairs"] != n / 2
    for task in TASKS:
        p = right[task] / n
        assert scores[f"acc_{task}"] == pytest.approx(p), task
        assert scores[f"acc_stderr_{task}"] == pytest.approx(math.sqrt(p * (1 - p) / (n - 1))), task
    assert scores["avg_acc"] == pytest.approx(sum(right.values()) / (3 * n))
    assert scores["eval_task_versions"] == dict.fromkeys(sorted(TASKS), 1.0)
    # each task's floors, read from lm-eval's samples, against the items: chance, and the answer most
    # frequent among the other items' answers (brute force, ties at random)
    golds = {
        "replaceme_world_mc": [(i["choices"][i["answer"]], i["choices"]) for i in shipped("replaceme_world_mc")[:n]],
        "replaceme_doc_cloze": [(i["target"], None) for i in shipped("replaceme_doc_cloze")[:n]],
        "replaceme_doc_pairs": [(i["good"], [i["good"], i["bad"]]) for i in shipped("replaceme_doc_pairs")[:n]],
    }
    for task, items in golds.items():
        expected = 0.0
        for k, (gold, choices) in enumerate(items):
            others = [g for j, (g, _) in enumerate(items) if j != k]
            candidates = choices if choices is not None else sorted({g for g, _ in items})
            votes = {c: others.count(c) for c in candidates}
            tied = [c for c, v in votes.items() if v == max(votes.values())]
            expected += (gold in tied) / len(tied)
        assert scores[f"floor_majority_{task}"] == pytest.approx(expected / n), task
    assert scores["floor_chance_replaceme_world_mc"] == 0.25 and scores["floor_chance_replaceme_doc_pairs"] == 0.5
    assert scores["floor_chance_replaceme_doc_cloze"] is None
    answers = [g for g, _ in golds["replaceme_world_mc"]]
    numbered: dict = {}
    assert scores["item_clusters_replaceme_world_mc"] == [numbered.setdefault(a, len(numbered)) for a in answers]
    assert scores["item_clusters_replaceme_doc_pairs"] is None
