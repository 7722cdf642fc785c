"""The offline lm-eval tasks (replaceme_exp/evaluation/offline_items.py, docs/guides/offline-tasks.md):
the shipped items are what the builder writes from the installed sources, each item is true to its
source (read here without the builder's code), no item shares an 8-word sequence with any offline
calibration text or the held-out perplexity text, the suites use them, and lm-eval scores them as
the task files say (checked against log-likelihoods computed here)."""

from __future__ import annotations

import ast
import hashlib
import importlib.resources
import os
import re
import sysconfig
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers.config import compose_config, typed
from helpers.offline_tasks import MANIFEST, TASKS, shipped

from replaceme_exp.evaluation import offline_items
from replaceme_exp.evaluation.harness import OFFLINE_TASKS


# Each task's items by its YAML's metadata.version (the row's eval_task_versions): new items need a new
# version, so that rows scored on other items say so (the sha256 of the JSONL file).
ITEM_VERSIONS = {
    "replaceme_world_mc": {1.0: "5e7dc21837d8e4aa8e1faf057e02189abf8049ba168aa57e3c6963ca4d722001"},
    "replaceme_doc_cloze": {1.0: "438af52c732655deaa7728b16bf44fcfbdfe509a83bcd7cc4bcb00c2ddcad93f"},
    "replaceme_doc_pairs": {1.0: "b2573bcecac76b006b4bc0a041308cee6a52cc572c7b3f94d3be91664c337605"},
}


def differing_sources() -> dict:
    """The sources whose installed version is not the one the shipped items were built from."""
    here = offline_items.source_versions()
    return {k: (v, here.get(k)) for k, v in MANIFEST["sources"].items() if here.get(k) != v}


def same_sources_or_skip(*names: str) -> None:
    differ = {k: v for k, v in differing_sources().items() if not names or k in names}
    if differ:
        pytest.skip(
            "the shipped items were built from other source versions (built, installed): "
            + ", ".join(f"{k} {a} / {b}" for k, (a, b) in differ.items())
            + "; their checksums, sizes and overlap are still checked"
        )


def test_three_tasks_of_three_kinds_and_over_a_thousand_items_ship_as_their_manifest_says():
    kinds = set()
    for task in TASKS:
        entry = MANIFEST["tasks"][task]
        data = (OFFLINE_TASKS / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], task
        assert len(data.decode("utf-8").splitlines()) == entry["items"], task
        spec = yaml.safe_load((OFFLINE_TASKS / entry["file"].replace(".jsonl", ".yaml")).read_text())
        assert spec["task"] == task and spec["dataset_kwargs"]["data_files"]["test"] == f"__DIR__/{entry['file']}"
        version = spec["metadata"]["version"]
        assert ITEM_VERSIONS[task].get(version) == entry["sha256"], f"{task}: new items need a new metadata.version"
        kinds.add((spec["output_type"], spec["doc_to_text"] == ""))
    # multiple choice after a question, a greedy continuation, and two sentences scored alone
    assert kinds == {("multiple_choice", False), ("loglikelihood", False), ("multiple_choice", True)}
    assert sum(MANIFEST["tasks"][t]["items"] for t in TASKS) >= 1000
    assert MANIFEST["ngram"] == 8 and set(MANIFEST["sources"]) == {"python", "tzdata", "iana_tz", "babel", "cldr"}


@pytest.mark.slow
def test_the_shipped_items_are_what_the_builder_writes_from_the_installed_sources(tmp_path):
    """Built again here (seeded, no model): byte for byte the shipped files and manifest. Other
    versions of Python (the docstrings), tzdata or Babel (CLDR) give other items, so then the test
    is skipped, naming them; ``make offline-tasks`` rebuilds the files for the installed versions."""
    same_sources_or_skip()
    manifest = offline_items.write(tmp_path)
    assert manifest == MANIFEST
    for name in [*(MANIFEST["tasks"][t]["file"] for t in TASKS), "offline_items.json"]:
        assert (tmp_path / name).read_bytes() == (OFFLINE_TASKS / name).read_bytes(), name


def test_the_first_items_of_each_file_are_a_mixed_sample():
    """``eval=quick`` takes the first items of each file: both relations and all three corruptions
    are among them, in no source order."""
    limit = typed(["eval=quick"]).eval.harness.limit
    world, pairs = shipped("replaceme_world_mc"), shipped("replaceme_doc_pairs")
    assert Counter(i["relation"] for i in world[:limit]).keys() == {"city_country", "country_currency"}
    assert Counter(i["kind"] for i in pairs[:limit]).keys() == {"swap", "agreement", "preposition"}
    assert Counter(i["kind"] for i in pairs) == {"swap": 134, "agreement": 133, "preposition": 133}
    questions = [i["question"] for i in world]
    assert questions != sorted(questions) and len(set(questions)) == len(questions)
    assert Counter(i["answer"] for i in world).keys() == {0, 1, 2, 3}


def tz_rows(name: str) -> list[list[str]]:
    text = importlib.resources.files("tzdata").joinpath("zoneinfo", name).read_text(encoding="utf-8")
    return [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]


def test_each_world_item_has_one_true_answer_by_its_source():
    same_sources_or_skip("tzdata", "iana_tz", "babel", "cldr")
    import datetime

    from babel import Locale, numbers

    names = Locale("en").territories
    countries_of = {}
    for row in tz_rows("zone.tab"):
        city = row[2].rsplit("/", 1)[-1].replace("_", " ")
        countries_of.setdefault(city, set()).add(names.get(row[0]))
    country_code = {names[row[0]]: row[0] for row in tz_rows("iso3166.tab") if row[0] in names}
    for item in shipped("replaceme_world_mc"):
        choices, answer = item["choices"], item["choices"][item["answer"]]
        assert len(set(choices)) == 4, item
        if item["relation"] == "city_country":
            city = re.fullmatch(r"In which country is the city of (.+)\?", item["question"]).group(1)
            assert countries_of[city] == {answer}, item  # one country, the answer; the others are not it
        else:
            country = re.fullmatch(r"What is the currency of (.+)\?", item["question"]).group(1)
            codes = numbers.get_territory_currencies(
                country_code[country], start_date=datetime.date(2026, 1, 1), tender=True
            )
            assert [numbers.get_currency_name(c, locale="en") for c in codes] == [answer], item


def flat_docstrings() -> list[str]:
    """Every docstring of the standard library's source files (not its test suite), whitespace runs
    as one space."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "pydoc_data", "test", "tests")]
        for name in names:
            if name.endswith(".py"):
                try:
                    tree = ast.parse((Path(folder) / name).read_text(encoding="utf-8"))
                except (SyntaxError, UnicodeDecodeError, ValueError):
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        if doc := ast.get_docstring(node):
                            out.append(" ".join(doc.split()))
    return out


@pytest.mark.slow
def test_cloze_passages_and_real_sentences_are_standard_library_docstrings_and_corruptions_are_one_edit():
    same_sources_or_skip("python")
    docs = "\n".join(flat_docstrings())
    for item in shipped("replaceme_doc_cloze"):
        assert f"{item['context']} {item['target']}." in docs, item  # contiguous docstring text
        assert item["target"].isalpha() and len(item["target"]) >= 3
        assert 25 <= len(item["context"].split()) <= 99, item  # 20-60 words, then 5-39 of the sentence
    for item in shipped("replaceme_doc_pairs"):
        assert item["good"] in docs, item
        good, bad = item["good"][:-1].split(" "), item["bad"][:-1].split(" ")
        changed = [i for i, (g, b) in enumerate(zip(good, bad)) if g != b]
        assert len(good) == len(bad) and item["bad"].endswith("."), item
        if item["kind"] == "swap":
            i = changed[0]
            assert changed == [i, i + 1] and (bad[i], bad[i + 1]) == (good[i + 1], good[i]), item
        elif item["kind"] == "agreement":
            pairs = [{"is", "are"}, {"was", "were"}, {"has", "have"}, {"does", "do"}]
            assert len(changed) == 1 and {good[changed[0]], bad[changed[0]]} in pairs, item
        else:
            prepositions = {"in", "on", "at", "of", "for", "to", "from", "by", "with", "into", "about", "over"}
            assert len(changed) == 1 and {good[changed[0]], bad[changed[0]]} <= prepositions, item


def test_the_builder_drops_an_item_that_overlaps_a_reference_text():
    sentence = "Return the number of items in the container, counting each item once."
    reference = offline_items.ngrams("see how to return the number of items in the container for a list")
    assert offline_items.overlapping([sentence], reference)
    assert not offline_items.overlapping(["Return the number of items in a box."], reference)
    assert offline_items.ngrams("A b, c-d e f g h!", 8) == {"a b c d e f g h"}


def test_corruptions_and_cloze_items_follow_their_rules():
    import random

    rng = random.Random(0)
    sentence = "The value is stored in the cache of the parser."
    assert offline_items.corrupt(sentence, "agreement", rng) == "The value are stored in the cache of the parser."
    swapped = offline_items.corrupt(sentence, "swap", rng)
    assert sorted(swapped[:-1].split()) == sorted(sentence[:-1].split()) and swapped != sentence
    assert swapped.split()[0] == "The"  # the first word stays
    assert offline_items.corrupt("Nothing here fits a rule at all.", "agreement", rng) is None
    before = " ".join(f"w{i}." if i % 10 == 9 else f"w{i}" for i in range(100))
    item = offline_items.cloze_item("It returns the parsed value.", before)
    assert item["target"] == "value" and item["context"].endswith("It returns the parsed")
    assert item["context"].split()[0] == "w50"  # from the first sentence start in the last 60 words
    assert offline_items.cloze_item("It returns the parsed value.", "too short") is None
    assert offline_items.cloze_item("It returns the value of x.", before) is None  # one-letter word
    with pytest.raises(ValueError, match="unknown corruption"):
        offline_items.corrupt(sentence, "reverse", rng)


@pytest.mark.slow
def test_quick_runs_a_subset_of_the_offline_suites_tasks_and_other_suites_do_not_inherit_them():
    quick, offline = typed(["eval=quick"]).eval.harness, typed(["eval=offline"]).eval.harness
    assert list(quick.tasks) == list(TASKS) and quick.local_tasks and quick.limit == 40
    assert list(offline.tasks) == [*TASKS, "replaceme_pydoc_ppl"] and offline.limit is None
    assert {t: offline.metrics[t] for t in TASKS} == dict(quick.metrics) == dict.fromkeys(TASKS, "acc")
    assert (quick.batch_size, quick.max_length, quick.add_bos_token) == (8, 512, False)
    assert compose_config([]).eval.name == "quick"  # the default job's suite
    for preset in (["debug=smoke"], ["debug=quick"], ["eval=heldout"]):
        assert compose_config(preset).eval.harness is None and compose_config(preset).eval.name == "heldout"
    for suite in ("paper", "sciq", "leaderboard", "llama2_table"):
        assert not set(TASKS) & set(compose_config([f"eval={suite}"]).eval.harness.tasks), suite
