"""lm-eval on the in-memory model with the project's offline tasks; baseline scores cached."""

from __future__ import annotations

from replaceme_exp.evaluation.harness import materialize_offline_tasks, metric_column


def test_offline_tasks_materialize_with_absolute_paths(tmp_path):
    target = materialize_offline_tasks(tmp_path / "tasks", n_ppl_docs=3)
    yamls = {p.name: p.read_text() for p in target.glob("*.yaml")}
    # the offline tasks, and the two toy tasks of the suite before them (kept for its rows' reruns)
    assert set(yamls) == {
        f"{t}.yaml" for t in ("world_mc", "doc_cloze", "doc_pairs", "capitals", "opposites", "pydoc_ppl")
    }
    assert {p.name for p in target.glob("*.jsonl")} == {
        p.name.replace(".yaml", ".jsonl") for p in target.glob("*.yaml")
    }
    assert all(str(target) in text and "__DIR__" not in text for text in yamls.values())
    assert len((target / "pydoc_ppl.jsonl").read_text().splitlines()) == 3
    assert metric_column("piqa", "acc_norm") == "acc_norm_piqa"
    assert metric_column("lambada_openai", "perplexity", {"lambada_openai": "lambada"}) == "ppl_lambada"
