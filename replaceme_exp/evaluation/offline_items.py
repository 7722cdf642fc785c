"""The items of the offline lm-eval tasks, built once from text that is on every machine after
``make setup`` and shipped as JSONL files in ``offline_tasks/`` (``make offline-tasks`` rebuilds them).

Three tasks of different kinds (``docs/guides/offline-tasks.md``):

- ``replaceme_world_mc`` (multiple choice among 4, ``acc``): in which country a city is (the cities
  of the IANA time-zone database, ``tzdata``'s ``zone.tab``) and what a country's currency is
  (Unicode CLDR through Babel); country and currency names are CLDR's English ones.
- ``replaceme_doc_cloze`` (last word, greedy match, as LAMBADA): a sentence of a standard-library
  docstring after up to :data:`CONTEXT_WORDS` words of the same docstring, without its last word.
- ``replaceme_doc_pairs`` (minimal pairs, as BLiMP): a standard-library docstring sentence against
  the same sentence with one corruption (two adjacent words swapped, a verb's number flipped, or a
  preposition replaced); the model should give the real sentence the higher likelihood.

The docstrings are read from the standard library's source files (``ast``, nothing is imported),
never from ``pydoc_data.topics``, the calibration and held-out perplexity text. An item whose text
shares an :data:`NGRAM`-word sequence with any offline calibration text or with the held-out
perplexity text (:func:`reference_texts`) is dropped. Each file is shuffled once (seeded), so the
first N items are a random sample (``eval.harness.limit``). The builder records the source
versions it read in :data:`MANIFEST`; the same versions give the same files byte for byte.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import os
import platform
import random
import re
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Iterable, Iterator

from replaceme_exp.data.heldout_documents import NGRAM, calibration_texts, heldout_documents, ngrams
from replaceme_exp.data.sources import pydoc_text

OFFLINE_TASKS = Path(__file__).parent / "offline_tasks"
MANIFEST = OFFLINE_TASKS / "offline_items.json"
# Bump when the builder's rules change (the items then change with the same sources).
BUILDER_VERSION = 1
SEED = 20261126
# An item sharing a sequence of NGRAM words with a calibration or held-out text is dropped.
CLOZE_ITEMS = 400
PAIR_ITEMS = 400
# The cloze context: at least 20 and at most 60 words of the docstring before the sentence.
CONTEXT_WORDS = (20, 60)
SENTENCE_WORDS = (6, 40)
# Currencies in tender on this date (CLDR dates them), so that a rebuild next year gives the same items.
CURRENCY_DATE = datetime.date(2026, 1, 1)
TASK_FILES = {
    "replaceme_world_mc": "world_mc.jsonl",
    "replaceme_doc_cloze": "doc_cloze.jsonl",
    "replaceme_doc_pairs": "doc_pairs.jsonl",
}
MC_TEMPLATES = {
    "city_country": "In which country is the city of {}?",
    "country_currency": "What is the currency of {}?",
}
# Standard-library folders and files left out: the calibration text (pydoc_data), the test suite,
# what distributions package separately (idlelib, tkinter, turtle, lib2to3, distutils, ensurepip,
# venv), generated or encoded text (encodings, this.py) and the installed packages.
STDLIB_EXCLUDED = frozenset(
    {
        "__phello__",
        "__pycache__",
        "distutils",
        "encodings",
        "ensurepip",
        "idlelib",
        "lib-dynload",
        "lib2to3",
        "pydoc_data",
        "site-packages",
        "test",
        "tests",
        "tkinter",
        "turtledemo",
        "venv",
        "__hello__.py",
        "antigravity.py",
        "this.py",
        "turtle.py",
    }
)
_SENTENCE = re.compile(r"^[A-Z][a-z]*(?:[ ,;'-]+[A-Za-z]+)*\.$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
AGREEMENT = {
    **{"is": "are", "was": "were", "has": "have", "does": "do"},
    **{"are": "is", "were": "was", "have": "has", "do": "does"},
}
PREPOSITIONS = ("in", "on", "at", "of", "for", "to", "from", "by", "with", "into", "about", "over")
CORRUPTIONS = ("swap", "agreement", "preposition")


# --- sources -----------------------------------------------------------------------------------


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def source_versions() -> dict[str, str | None]:
    """The versions of every source the builder reads: Python (its standard library's docstrings),
    tzdata (its IANA release too), Babel and the CLDR release it carries."""
    try:
        import tzdata

        iana = getattr(tzdata, "IANA_VERSION", None)
    except ImportError:
        iana = None
    try:
        from babel.core import get_cldr_version

        cldr = str(get_cldr_version())
    except ImportError:
        cldr = None
    return {
        "python": platform.python_version(),
        "tzdata": _package_version("tzdata"),
        "iana_tz": iana,
        "babel": _package_version("babel"),
        "cldr": cldr,
    }


def _require(module: str) -> None:
    """One line naming what is missing (tzdata comes with the project, Babel with its dev extra)."""
    try:
        __import__(module)
    except ImportError as err:
        reason = "which is not installed (pip install -e '.[dev]')"
        raise SystemExit(f"the offline-task builder reads {module}, {reason}") from err


def _tz_table(name: str) -> list[list[str]]:
    import importlib.resources

    text = importlib.resources.files("tzdata").joinpath("zoneinfo", name).read_text(encoding="utf-8")
    return [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]


def country_names() -> dict[str, str]:
    """CLDR's English name of every ISO 3166 country code tzdata lists (``iso3166.tab``)."""
    from babel import Locale

    names = Locale("en").territories
    return {row[0]: names[row[0]] for row in _tz_table("iso3166.tab") if row[0] in names}


def city_country_pairs() -> list[tuple[str, str]]:
    """(city, country) of each zone of tzdata's ``zone.tab``: the zone's last part as the city
    (``America/Buenos_Aires`` -> ``Buenos Aires``), in file order; Antarctica's stations, names
    that are not plain words (``DumontDUrville``), cities named like their country (``Andorra``)
    and repeated cities are left out."""
    countries = country_names()
    pairs, seen = [], set()
    for row in _tz_table("zone.tab"):
        code, zone = row[0], row[2]
        city = zone.rsplit("/", 1)[-1].replace("_", " ")
        country = countries.get(code)
        if country is None or code == "AQ" or city in seen:
            continue
        if not re.fullmatch(r"[A-Z][a-z]+(?:[ -][A-Za-z][a-z]+)*", city):
            continue
        if city.lower() in country.lower() or country.lower() in city.lower():
            continue
        seen.add(city)
        pairs.append((city, country))
    return pairs


def country_currency_pairs() -> list[tuple[str, str]]:
    """(country, currency) for each country (ISO 3166, CLDR's English names) with exactly one
    currency in tender on :data:`CURRENCY_DATE`, in code order."""
    from babel import numbers

    pairs = []
    for code, country in sorted(country_names().items()):
        currencies = numbers.get_territory_currencies(code, start_date=CURRENCY_DATE, tender=True)
        if len(currencies) == 1:
            pairs.append((country, numbers.get_currency_name(currencies[0], locale="en")))
    return pairs


def stdlib_files(root: str | os.PathLike | None = None) -> list[Path]:
    """The standard library's ``.py`` files under ``root`` (the running Python's), sorted, without
    :data:`STDLIB_EXCLUDED` and the platform's generated ``_sysconfigdata*`` and ``config-*``."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for top in sorted(os.listdir(root)):
        if top in STDLIB_EXCLUDED or top.startswith(("config-", "_sysconfigdata")):
            continue
        path = root / top
        if path.is_dir():
            for folder, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in STDLIB_EXCLUDED)
                files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
        elif top.endswith(".py"):
            files.append(path)
    return files


def docstrings(files: Iterable[Path]) -> Iterator[str]:
    """The docstrings (``inspect.cleandoc``-ed) of every module, class and function of ``files``,
    file by file, in ``ast.walk`` order; a file that does not parse is left out."""
    for file in files:
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if text := ast.get_docstring(node, clean=True):
                    yield text


def is_prose(sentence: str) -> bool:
    """A plain English sentence: a capital, then words of letters (hyphens and apostrophes inside)
    separated by spaces, commas or semicolons, a final full stop, :data:`SENTENCE_WORDS` words, no
    camel-case identifier."""
    if not _SENTENCE.match(sentence):
        return False
    words = sentence[:-1].split()
    if not SENTENCE_WORDS[0] <= len(words) <= SENTENCE_WORDS[1]:
        return False
    return not any(re.search(r"[a-z][A-Z]", w) for w in words)


def prose_sentences(docstring: str) -> list[tuple[str, str]]:
    """(sentence, the docstring's text before it) for each prose sentence (:func:`is_prose`) of the
    docstring's paragraphs of plain text (paragraphs with an indented or ``>>>`` line are code);
    whitespace runs become one space."""
    flat = " ".join(docstring.split())
    out, start = [], 0
    for paragraph in re.split(r"\n\s*\n", docstring):
        lines = paragraph.split("\n")
        if any(line.startswith((" ", "\t", ">>>")) for line in lines):
            continue
        for sentence in _SENTENCE_END.split(" ".join(line.strip() for line in lines)):
            if is_prose(sentence) and (at := flat.find(sentence, start)) >= 0:
                out.append((sentence, flat[:at].strip()))
                start = at + len(sentence)
    return out


# --- items -------------------------------------------------------------------------------------


def multiple_choice(pairs: list[tuple[str, str]], relation: str, rng: random.Random) -> list[dict]:
    """One item per (subject, answer) pair: the question of ``relation`` about the subject, the
    answer and 3 distractors drawn from the relation's other answers, in a random order."""
    answers = sorted({a for _, a in pairs})
    items = []
    for subject, answer in pairs:
        choices = rng.sample([a for a in answers if a != answer], 3) + [answer]
        rng.shuffle(choices)
        question = MC_TEMPLATES[relation].format(subject)
        items.append({"question": question, "choices": choices, "answer": choices.index(answer), "relation": relation})
    return items


def cloze_item(sentence: str, before: str) -> dict | None:
    """The sentence's last word (letters only, 3 or more) after the docstring's text before the
    sentence (at most the last :data:`CONTEXT_WORDS` [1] words, from a sentence start where one
    falls inside them) and the sentence without that word; None without enough context."""
    words = sentence[:-1].split()
    target = words[-1]
    if not (target.isalpha() and len(target) >= 3):
        return None
    previous = before.split()
    if len(previous) < CONTEXT_WORDS[0]:
        return None
    window = previous[-CONTEXT_WORDS[1] :]
    if len(previous) > CONTEXT_WORDS[1]:
        starts = [i for i in range(1, len(window) - CONTEXT_WORDS[0] + 1) if window[i - 1][-1] in ".!?"]
        window = window[starts[0] :] if starts else window
    return {"context": " ".join(window + words[:-1]), "target": target}


def corrupt(sentence: str, kind: str, rng: random.Random) -> str | None:
    """``sentence`` with one corruption of ``kind`` (None where it has no place for one): ``swap``
    two adjacent lower-case words (not the first), ``agreement``: a verb's number flipped (is/are,
    was/were, has/have, does/do), ``preposition``: one preposition replaced by another."""
    words = sentence[:-1].split(" ")
    if kind == "swap":
        places = [
            i
            for i in range(1, len(words) - 1)
            if words[i].isalpha() and words[i + 1].isalpha() and words[i].islower() and words[i + 1].islower()
            and words[i] != words[i + 1]
        ]  # fmt: skip
        if not places:
            return None
        i = rng.choice(places)
        words[i], words[i + 1] = words[i + 1], words[i]
    elif kind == "agreement":
        places = [i for i in range(1, len(words)) if words[i] in AGREEMENT]
        if not places:
            return None
        i = rng.choice(places)
        words[i] = AGREEMENT[words[i]]
    elif kind == "preposition":
        places = [i for i in range(1, len(words)) if words[i] in PREPOSITIONS]
        if not places:
            return None
        i = rng.choice(places)
        words[i] = rng.choice([p for p in PREPOSITIONS if p != words[i]])
    else:
        raise ValueError(f"unknown corruption {kind!r}; choose one of {CORRUPTIONS}")
    return " ".join(words) + "."


def pair_items(sentences: list[str], n_items: int, reference: set[str], rng: random.Random) -> tuple[list[dict], dict]:
    """``n_items`` minimal pairs, a third of each kind of corruption: each sentence in turn takes
    the kind with the fewest pairs so far among those that have a place in it and room left; a pair
    whose text overlaps ``reference`` is dropped. Returns the pairs in a random order and the counts
    (sentences read, pairs dropped for overlap)."""
    quota = {kind: n_items // len(CORRUPTIONS) + (i < n_items % len(CORRUPTIONS)) for i, kind in enumerate(CORRUPTIONS)}
    made: dict[str, list[dict]] = {kind: [] for kind in CORRUPTIONS}
    read = dropped = 0
    for sentence in sentences:
        if all(len(made[k]) >= quota[k] for k in CORRUPTIONS):
            break
        read += 1
        for kind in sorted(CORRUPTIONS, key=lambda k: (len(made[k]), CORRUPTIONS.index(k))):
            if len(made[kind]) >= quota[kind] or (bad := corrupt(sentence, kind, rng)) is None:
                continue
            item = {"good": sentence, "bad": bad, "kind": kind}
            if overlapping(item_texts("replaceme_doc_pairs", item), reference):
                dropped += 1
            else:
                made[kind].append(item)
            break
    pairs = [item for kind in CORRUPTIONS for item in made[kind]]
    rng.shuffle(pairs)
    return pairs, {"candidates": read, "dropped_overlap": dropped}


def item_texts(task: str, item: dict) -> list[str]:
    """The texts of an item that the overlap check reads: the question with its answer and each
    choice, the cloze context with its word, both sentences of a pair."""
    if task == "replaceme_world_mc":
        return [f"Question: {item['question']}\nAnswer: {item['choices'][item['answer']]}", *item["choices"]]
    if task == "replaceme_doc_cloze":
        return [f"{item['context']} {item['target']}"]
    return [item["good"], item["bad"]]


# --- the overlap filter ------------------------------------------------------------------------


def reference_texts() -> dict[str, list[str]]:
    """Every offline calibration text (:func:`~replaceme_exp.data.heldout_documents.calibration_texts`)
    and the held-out perplexity texts, by name: the held-out pydoc part (``eval.text=pydoc_heldout`` and
    the rolling-perplexity task) and the held-out documents (``eval.text=documents``)."""
    return {
        **calibration_texts(),
        "pydoc_heldout": [pydoc_text("heldout")],
        "heldout_documents": [d.text for d in heldout_documents()],
    }


def overlapping(texts: Iterable[str], reference: set[str]) -> bool:
    return any(ngrams(t) & reference for t in texts)


# --- the build ---------------------------------------------------------------------------------


def build_items(seed: int = SEED) -> tuple[dict[str, list[dict]], dict]:
    """The items of every task ({task: items}, each list in its shipped order) and what the build
    read and dropped (the manifest without checksums)."""
    _require("tzdata")
    _require("babel")
    rng = random.Random(seed)
    reference = set().union(*(ngrams(t) for texts in reference_texts().values() for t in texts))
    counts: dict[str, dict] = {}

    def kept(task: str, items: list[dict]) -> list[dict]:
        clean = [item for item in items if not overlapping(item_texts(task, item), reference)]
        counts[task] = {"candidates": len(items), "dropped_overlap": len(items) - len(clean)}
        return clean

    cities, currencies = city_country_pairs(), country_currency_pairs()
    world = multiple_choice(cities, "city_country", rng) + multiple_choice(currencies, "country_currency", rng)
    world = kept("replaceme_world_mc", world)
    rng.shuffle(world)

    files = stdlib_files()
    sentences, seen = [], set()
    for docstring in docstrings(files):
        for sentence, before in prose_sentences(docstring):
            if sentence not in seen:
                seen.add(sentence)
                sentences.append((sentence, before))
    rng.shuffle(sentences)
    candidates = {s: item for s, b in sentences if (item := cloze_item(s, b)) is not None}
    cloze = kept("replaceme_doc_cloze", list(candidates.values()))[:CLOZE_ITEMS]
    # a sentence is an item of one task only
    used = {id(item) for item in cloze}
    rest = [s for s, _ in sentences if id(candidates.get(s)) not in used]
    pairs, counts["replaceme_doc_pairs"] = pair_items(rest, PAIR_ITEMS, reference, rng)

    items = {"replaceme_world_mc": world, "replaceme_doc_cloze": cloze, "replaceme_doc_pairs": pairs}
    manifest = {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "ngram": NGRAM,
        "sources": source_versions(),
        "stdlib_files": len(files),
        "stdlib_prose_sentences": len(sentences),
        "tasks": {
            task: {"file": TASK_FILES[task], "items": len(task_items), **counts[task]}
            for task, task_items in items.items()
        },
    }
    return items, manifest


def jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode("utf-8")


def write(out_dir: str | os.PathLike, seed: int = SEED) -> dict:
    """Build the items and write each task's JSONL file and the manifest (with each file's sha256)
    into ``out_dir``; returns the manifest."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items, manifest = build_items(seed)
    for task, task_items in items.items():
        data = jsonl(task_items)
        (out / TASK_FILES[task]).write_bytes(data)
        manifest["tasks"][task]["sha256"] = hashlib.sha256(data).hexdigest()
    (out / MANIFEST.name).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(OFFLINE_TASKS), help="where the JSONL files and the manifest go")
    args = parser.parse_args(argv)
    manifest = write(args.out)
    for task, entry in manifest["tasks"].items():
        print(f"{task}: {entry['items']} items ({entry['dropped_overlap']} of {entry['candidates']} dropped: overlap)")
    print("sources:", ", ".join(f"{k} {v}" for k, v in manifest["sources"].items()), file=sys.stderr)


if __name__ == "__main__":
    main()
