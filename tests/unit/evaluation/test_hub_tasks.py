"""The hub-data lm-eval tasks of eval=llama2_table (replaceme_exp/evaluation/hub_tasks): indexing,
prompts on hand-written documents in each dataset's schema, and the suite config. Offline: the
tasks are built on in-memory datasets, nothing is downloaded."""

from __future__ import annotations

import pytest
from helpers.config import compose_config, typed

from replaceme_exp.evaluation import harness
from replaceme_exp.evaluation.harness import HUB_TASKS


HUB_TASK_NAMES = {"replaceme_c3", "replaceme_cmnli", "replaceme_chid", "replaceme_race_middle", "replaceme_race_high"}

C3_DOC = {
    "id": 0,
    "context": ["男：你今天怎么来得这么早？", "女：我怕路上堵车。"],
    "question": "女的为什么来得早？",
    "choice": ["怕堵车", "想看书", "没睡好"],
    "answer": "怕堵车",
}
CMNLI_DOC = {"sentence1": "他在公园里跑步。", "sentence2": "他在运动。", "label": 1, "idx": 0}
CHID_DOC = {
    "id": 14,
    "candidates": ["用武之地", "变化无穷", "近在咫尺", "费尽心机", "投石问路", "大红大紫", "优哉游哉"],
    "content": "十五巧板玩起来#idiom#，有启发智慧的功用。",
    "answer": 1,
}
RACE_DOC = {
    "example_id": "middle1.txt",
    "article": "Tom has a dog. It is black.",
    "question": "What does Tom have?",
    "options": ["A cat.", "A dog.", "A bird.", "A fish."],
    "answer": "B",
}

# task -> (document, unscorable document dropped by process_docs or None, context, continuations, target)
EXPECTED = {
    "replaceme_c3": (
        C3_DOC,
        {**C3_DOC, "answer": ""},  # hidden test answer
        "文章：男：你今天怎么来得这么早？ 女：我怕路上堵车。\n问题：女的为什么来得早？\n答案：",
        ["怕堵车", "想看书", "没睡好"],
        0,
    ),
    "replaceme_cmnli": (
        CMNLI_DOC,
        {**CMNLI_DOC, "label": -1},  # hidden test label
        "语句一：“他在公园里跑步。”\n语句二：“他在运动。”\n请问这两句话是什么关系？\n",
        ["无关", "蕴含", "矛盾"],  # ClassLabel order: neutral, entailment, contradiction
        1,
    ),
    "replaceme_chid": (
        CHID_DOC,
        {**CHID_DOC, "content": "没有空格的句子。"},
        "以下句子是否通顺？\n",
        [f"十五巧板玩起来{idiom}，有启发智慧的功用。\n这个句子是通顺的。" for idiom in CHID_DOC["candidates"]],
        1,
    ),
    "replaceme_race_middle": (
        RACE_DOC,
        None,
        "Article:\nTom has a dog. It is black.\nQuestion:\nWhat does Tom have?\n"
        "A. A cat.\nB. A dog.\nC. A bird.\nD. A fish.\nAnswer:",
        [" A", " B", " C", " D"],
        1,
    ),
}
EXPECTED["replaceme_race_high"] = EXPECTED["replaceme_race_middle"]


@pytest.fixture(scope="module")
def full_index():
    """lm-eval's default task index plus hub_tasks, as run_harness builds it (takes a few seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(HUB_TASKS), include_defaults=True)


def hub_yaml(task: str) -> dict:
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(HUB_TASKS / f"{task}.yaml", resolve_func=True)


def offline_task(task: str, docs: list[dict]):
    """The task built from its YAML, with ``docs`` as the evaluated split instead of the hub data."""
    from datasets import Dataset, DatasetDict
    from lm_eval.api.task import ConfigurableTask

    config = hub_yaml(task)
    split = config["test_split"]
    config["custom_dataset"] = lambda **_: DatasetDict({split: Dataset.from_list(docs)})
    return ConfigurableTask(config=config)


def test_hub_tasks_are_indexed_from_their_own_directory():
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(HUB_TASKS), include_defaults=False)
    assert set(manager.all_tasks) == HUB_TASK_NAMES
    assert {p.stem for p in HUB_TASKS.glob("*.yaml")} == HUB_TASK_NAMES  # task name = file stem


@pytest.mark.slow
def test_every_llama2_table_task_is_known_to_lm_eval(full_index):
    tasks = list(compose_config(["eval=llama2_table"]).eval.harness.tasks)
    assert HUB_TASK_NAMES <= set(tasks)
    assert [t for t in tasks if t not in full_index.all_tasks] == []
    for name in HUB_TASK_NAMES:  # no clash with (and no override of) a built-in task
        assert full_index.task_index[name].yaml_path.parent == HUB_TASKS
    assert {"mmlu", "cmmlu"} <= set(full_index.all_groups)


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_prompt_functions_on_a_document_of_the_dataset_schema(task):
    doc, _, context, continuations, target = EXPECTED[task]
    config = hub_yaml(task)
    assert config["task"] == task and config["output_type"] == "multiple_choice"
    delimiter = config.get("target_delimiter", " ")
    assert config["doc_to_text"](doc) == context
    assert [delimiter + choice for choice in config["doc_to_choice"](doc)] == continuations
    assert config["doc_to_target"](doc) == target


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_task_requests_built_offline_from_the_yaml(task):
    doc, unscorable, context, continuations, target = EXPECTED[task]
    built = offline_task(task, [doc] if unscorable is None else [doc, unscorable])
    docs = list(built.test_docs())
    assert len(docs) == 1  # process_docs drops the unlabelled / blank-less document
    ctx = built.fewshot_context(docs[0], num_fewshot=0)
    assert ctx == context
    requests = built.construct_requests(docs[0], ctx, metadata=(task, 0, 1))
    assert [r.args for r in requests] == [(context, c) for c in continuations]
    assert built.doc_to_target(docs[0]) == target


def test_chid_reads_fewclue_test_and_the_clue_tasks_read_dev():
    assert hub_yaml("replaceme_chid")["dataset_kwargs"]["data_files"]["test"].endswith(
        "CLUEbenchmark/FewCLUE/main/datasets/chid/test_public.json"
    )
    for task, name in [("replaceme_c3", "c3"), ("replaceme_cmnli", "cmnli")]:
        config = hub_yaml(task)
        assert (config["dataset_path"], config["dataset_name"]) == ("clue/clue", name)
        assert config["test_split"] == "validation"  # CLUE test labels are hidden
    for level in ("middle", "high"):
        config = hub_yaml(f"replaceme_race_{level}")
        assert (config["dataset_path"], config["dataset_name"], config["test_split"]) == ("ehovy/race", level, "test")


def test_llama2_table_suite_composes():
    cfg = typed(["eval=llama2_table"]).eval
    h = cfg.harness
    tasks = dict(h.tasks)
    assert cfg.name == "llama2_table"
    assert harness.declared_metrics(h) == {task: "acc" for task in tasks} and len(tasks) == 10
    assert tasks == {
        "replaceme_c3": 0,
        "replaceme_cmnli": 0,
        "replaceme_chid": 0,
        "wsc": 0,
        "hellaswag": 0,
        "piqa": 0,
        "replaceme_race_middle": 0,
        "replaceme_race_high": 0,
        "mmlu": 5,
        "cmmlu": 5,
    }
    assert dict(h.ppl_names) == {} and h.local_tasks is False
    assert (h.batch_size, h.add_bos_token, h.max_length, h.limit) == (8, False, None, None)
    assert harness.accuracy_columns(h)[0] == "acc_replaceme_c3" and h.bootstrap_iters > 0


def test_run_harness_adds_hub_tasks_to_the_defaults(monkeypatch, tmp_path):
    import lm_eval.tasks

    seen = {}

    class Stop(Exception):
        pass

    def fake_manager(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", fake_manager)
    with pytest.raises(Stop):
        harness.run_harness(None, None, typed(["eval=llama2_table"]).eval.harness, tmp_path)
    assert seen["include_path"] == str(HUB_TASKS) and seen["include_defaults"] is True
    assert not (tmp_path / "lm_eval_tasks").exists()  # offline tasks are not materialized
