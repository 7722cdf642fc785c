"""The evaluation protocol: a declared metric per task, stderr and task versions from lm-eval,
every score-moving setting exposed, BOS-prefixed held-out perplexity windows."""

from __future__ import annotations

import json

import pytest
from helpers.config import CONF, compose_config, typed
from helpers.models import tiny_model
from omegaconf import OmegaConf

from replaceme_exp.data.batching import pack_windows
from replaceme_exp.evaluation.harness import (
    accuracy_columns,
    collect_items,
    collect_scores,
    declared_metrics,
    harness_settings,
    run_harness,
)
from replaceme_exp.row_format import decode_items, encode_items


SUITES = sorted(p.stem for p in (CONF / "eval").glob("*.yaml"))


@pytest.mark.slow
def test_every_suite_declares_one_metric_per_task():
    with_harness = []
    for suite in SUITES:
        h = compose_config([f"eval={suite}"]).eval.harness
        if h is None:  # held-out perplexity only (heldout, clip)
            continue
        with_harness.append(suite)
        tasks = OmegaConf.to_container(h.tasks)
        metrics = OmegaConf.to_container(h.metrics)
        assert list(metrics) == list(tasks), suite  # same tasks, same order (the tables' column order)
        assert all(isinstance(m, str) and m for m in metrics.values()), suite
        declared = declared_metrics(typed([f"eval={suite}"]).eval.harness)
        assert declared == metrics and "accuracy_tasks" not in h, suite
        assert int(h.bootstrap_iters) > 0, suite  # stderr on
    assert {"paper", "sciq", "offline", "leaderboard", "llama2_table"} <= set(with_harness)


def test_paper_suite_uses_the_papers_metrics():
    h = typed(["eval=paper"]).eval.harness
    assert declared_metrics(h) == {
        "race": "acc",
        "winogrande": "acc",
        "piqa": "acc_norm",
        "boolq": "acc",
        "openbookqa": "acc_norm",
        "sciq": "acc_norm",
        "lambada_openai": "perplexity",
    }
    assert accuracy_columns(h) == [
        "acc_race",
        "acc_winogrande",
        "acc_norm_piqa",
        "acc_boolq",
        "acc_norm_openbookqa",
        "acc_norm_sciq",
    ]
    assert declared_metrics(typed(["eval=sciq"]).eval.harness) == {"sciq": "acc_norm"}


def fake_results():
    """lm-eval's ``out["results"]`` shape, with its "N/A" stderr and a filtered metric."""
    return {
        "piqa": {
            "alias": "piqa",
            "acc,none": 0.70,
            "acc_stderr,none": 0.010,
            "acc_norm,none": 0.80,
            "acc_norm_stderr,none": 0.011,
        },
        "boolq": {"alias": "boolq", "acc,none": 0.60, "acc_stderr,none": "N/A"},
        "lambada_openai": {
            "alias": "lambada_openai",
            "perplexity,none": 4.0,
            "perplexity_stderr,none": 0.1,
            "acc,none": 0.5,
            "acc_stderr,none": 0.007,
        },
        "gsm": {
            "exact_match,strict-match": 0.2,
            "exact_match_stderr,strict-match": 0.02,
            "exact_match,none": 0.3,
            "exact_match_stderr,none": 0.03,
        },
    }


def test_avg_acc_is_the_mean_of_the_declared_metrics():
    metrics = {"piqa": "acc_norm", "boolq": "acc", "lambada_openai": "perplexity", "gsm": "exact_match"}
    scores = collect_scores(fake_results(), metrics, {"lambada_openai": "lambada"})
    assert scores["avg_acc"] == pytest.approx((0.80 + 0.60 + 0.3) / 3)  # not acc of piqa, not the ppl
    assert scores["score_piqa"] == 0.80 and scores["score_stderr_piqa"] == 0.011
    assert scores["acc_piqa"] == 0.70 and scores["acc_stderr_piqa"] == 0.010  # every metric kept
    assert scores["acc_norm_piqa"] == 0.80 and scores["acc_norm_stderr_piqa"] == 0.011
    assert scores["acc_boolq"] == 0.60 and "acc_stderr_boolq" not in scores and "score_stderr_boolq" not in scores
    assert scores["ppl_lambada"] == scores["score_lambada_openai"] == 4.0 and scores["ppl_stderr_lambada"] == 0.1
    assert scores["acc_lambada_openai"] == 0.5
    # the paper's "all benchmarks" average: Lambada's accuracy counts as one more task
    assert scores["avg_acc_all"] == pytest.approx((0.80 + 0.60 + 0.3 + 0.5) / 4)
    assert scores["exact_match_gsm"] == 0.3 and scores["exact_match_stderr_gsm"] == 0.03  # the "none" filter
    assert all(isinstance(v, float) for v in scores.values())
    # The same results under acc everywhere give another average: the declaration decides.
    acc = collect_scores(fake_results(), {"piqa": "acc", "boolq": "acc"})
    assert acc["avg_acc"] == pytest.approx((0.70 + 0.60) / 2) and "avg_acc_all" not in acc  # no Lambada declared
    with pytest.raises(RuntimeError, match="acc_norm"):
        collect_scores(fake_results(), {"boolq": "acc_norm"})


def logged(task: str, values: list[float], metric: str = "acc", order=None, filters=("none",)) -> list[dict]:
    """lm-eval's ``out["samples"][task]`` with ``log_samples``: one entry per document and filter,
    in any order."""
    order = order or range(len(values))
    return [
        {"doc_id": i, "doc_hash": f"{task}-{i}", "filter": f, metric: values[i] if f == "none" else 1 - values[i]}
        for f in filters
        for i in order
    ]


def test_collect_items_keeps_each_items_declared_metric_in_document_order():
    """Documents arrive out of order and under two filters (the ``none`` one counts); a group's items
    are its subtasks' items; a perplexity task has a document count and no items."""
    out = {
        "samples": {
            "piqa": logged("piqa", [1, 0, 1, 1], "acc_norm", order=[3, 1, 0, 2], filters=("strict", "none")),
            "mmlu_a": logged("mmlu_a", [1, 1]),
            "mmlu_b": logged("mmlu_b", [0, 1, 0]),
            "lambada_openai": logged("lambada_openai", [1.0, 0.0]),
        },
        "group_subtasks": {"mmlu": ["mmlu_a", "mmlu_b"]},
        "n-samples": {"lambada_openai": {"original": 5153, "effective": 2}},
    }
    metrics = {"piqa": "acc_norm", "mmlu": "acc", "lambada_openai": "perplexity"}
    columns = collect_items(out, metrics)
    assert columns["score_items_piqa"] == "1011" and columns["n_items_piqa"] == 4
    assert columns["score_items_mmlu"] == "11010" and columns["n_items_mmlu"] == 5
    assert columns["n_items_lambada_openai"] == 2 and "score_items_lambada_openai" not in columns
    assert columns["avg_acc_items"] == 9
    assert columns["avg_acc_ci_low"] <= (0.75 + 0.6) / 2 <= columns["avg_acc_ci_high"]
    reordered = {**out["samples"], "mmlu_a": logged("mmlu_a", [1, 1], order=[1, 0])}
    shuffled = collect_items({**out, "samples": reordered}, metrics)
    assert shuffled["items_hash_mmlu"] == columns["items_hash_mmlu"]  # the same documents
    other = collect_items({**out, "samples": {**out["samples"], "mmlu_a": logged("mmlu_c", [1, 1])}}, metrics)
    assert other["items_hash_mmlu"] != columns["items_hash_mmlu"]


def test_items_are_one_character_each_when_binary_and_a_list_otherwise():
    assert encode_items([1.0, 0.0, 1.0]) == "101"
    assert decode_items("101").tolist() == [1.0, 0.0, 1.0]
    assert encode_items([0.5, 1.0]) == [0.5, 1.0]
    assert decode_items(json.dumps([0.5, 1.0])).tolist() == [0.5, 1.0]  # read back from the store
    assert decode_items(None) is None and decode_items(float("nan")) is None


def test_declared_metrics_must_name_the_suites_tasks():
    h = typed(["eval=paper"]).eval.harness
    del h.metrics["sciq"]
    with pytest.raises(ValueError, match="sciq"):
        declared_metrics(h)


class CharTokenizer:
    """One token per character (ids 10..), EOS 2, and a BOS only when given."""

    eos_token_id = 2

    def __init__(self, bos_token_id=None):
        self.bos_token_id = bos_token_id

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [10 + (ord(c) % 50) for c in text]}


def windows_of(batches):
    return [row.tolist() for b in batches for row in b.input_ids]


def test_pack_windows_prefix_bos_and_keep_text_consecutive():
    docs = ["abcdefghij" * 3, "klmnopqrst" * 4, "uvwxyz" * 5]
    seq_len = 16
    for bos in (1, None):
        tok = CharTokenizer(bos)
        stream = []
        for d in docs:
            stream += tok(d)["input_ids"] + [tok.eos_token_id]
        batches = pack_windows(docs, tok, seq_len, max_windows=5, batch_size=2)
        windows = windows_of(batches)
        assert len(windows) == 5 and all(len(w) == seq_len for w in windows)
        assert int(sum(b.attention_mask.sum() for b in batches)) == 5 * seq_len  # no padding
        if bos is None:  # as before: seq_len consecutive stream tokens
            assert [t for w in windows for t in w] == stream[: 5 * seq_len]
        else:
            assert all(w[0] == bos for w in windows)
            text = [t for w in windows for t in w[1:]]
            assert text == stream[: 5 * (seq_len - 1)]  # consecutive, non-overlapping


def test_pack_windows_with_smollm2_start_with_its_bos(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.bos_token_id is not None
    docs = ["def f(x):\n    return x + 1\n" * 20, "The quick brown fox jumps over the lazy dog. " * 20]
    stream = []
    for d in docs:
        stream += tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    windows = windows_of(pack_windows(docs, tok, 32, max_windows=4, batch_size=3))
    assert len(windows) == 4 and all(len(w) == 32 and w[0] == tok.bos_token_id for w in windows)
    assert [t for w in windows for t in w[1:]] == stream[: 4 * 31]


@pytest.mark.slow
def test_the_harness_batch_size_is_the_protocols_unless_chosen(tmp_path, monkeypatch, smollm2_tokenizer):
    """protocol=official scores at lm-eval batch size 1 (eval_model's simple_evaluate default), the paper
    protocol at 8; a typed batch size wins under either; lm-eval receives the settled value."""
    import lm_eval

    sizes = {
        overrides: typed(["eval=paper", *overrides]).eval.harness.batch_size
        for overrides in [(), ("protocol=official",), ("protocol=official", "eval.harness.batch_size=8")]
    }
    assert list(sizes.values()) == [8, 1, 8]
    for suite in ("offline", "quick", "sciq", "leaderboard", "llama2_table"):
        assert typed([f"eval={suite}", "protocol=official"]).eval.harness.batch_size == 1, suite
    seen = []

    def stop(**kwargs):
        seen.append(kwargs["model"].batch_size)  # lm-eval's HFLM, built with the settled batch size
        raise RuntimeError("stop here")

    monkeypatch.setattr(lm_eval, "simple_evaluate", stop)
    h = typed(["eval=offline", "protocol=official"]).eval.harness
    model = tiny_model("llama", num_layers=2, vocab=len(smollm2_tokenizer), max_position_embeddings=1024)
    with pytest.raises(RuntimeError, match="stop here"):
        run_harness(model, smollm2_tokenizer, h, tmp_path)
    assert seen == [1] and harness_settings(h)["eval_batch_size"] == 1


def test_rows_record_the_protocols_lm_eval_version_and_whether_they_were_scored_with_it(monkeypatch):
    from replaceme_exp.evaluation import harness

    paper = harness.protocol_version_columns("paper")
    assert paper == {"lm_eval_version_protocol": None, "lm_eval_off_protocol": False}
    monkeypatch.setattr(harness, "lm_eval_version", lambda: "0.4.13")
    assert harness.protocol_version_columns("official") == {
        "lm_eval_version_protocol": "0.4.8",
        "lm_eval_off_protocol": True,
    }
    monkeypatch.setattr(harness, "lm_eval_version", lambda: "0.4.8")
    assert harness.protocol_version_columns("official")["lm_eval_off_protocol"] is False


def test_tables_mark_rows_scored_with_another_lm_eval_than_their_protocols():
    from helpers.tables import SPECS, frame, run

    from replaceme_exp.reporting import version_marks
    from replaceme_exp.reporting.paper_tables import build_table, to_markdown

    ls = dict(objective="ls", selection_metric="cosine", solver=None, solver_schedule=None)
    runs = frame(
        run(1, **ls, avg_acc=0.62, ppl_lambada=21.2, rp=0.9, lm_eval_off_protocol=True, lm_eval_version="0.4.13"),
        run(2, **ls, structure="diagonal", avg_acc=0.61, ppl_lambada=89.0, rp=0.88, lm_eval_off_protocol=False),
    )
    table = build_table(SPECS["structured_lts"], runs)
    labels = list(table["Setting"])
    assert labels[:2] == [f"Generic {version_marks.MARK}", "Diagonal"]
    assert version_marks.NOTE in to_markdown(SPECS["structured_lts"], table)
    unmarked = build_table(SPECS["structured_lts"], frame(run(2, **ls, avg_acc=0.61, ppl_lambada=89.0, rp=0.88)))
    assert version_marks.NOTE not in to_markdown(SPECS["structured_lts"], unmarked)
