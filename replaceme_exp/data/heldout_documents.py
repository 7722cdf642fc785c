"""The held-out documents of ``eval.text=documents``: many documents from two domains, so that a
perplexity interval can resample documents rather than adjacent windows of one text.

- ``pydoc``: the sections (split at their headings) of the held-out part of ``pydoc_data.topics``
  (the Python language reference as it ships with Python; PSF licence), disjoint from the calibration
  part (:func:`~replaceme_exp.data.sources.pydoc_text`).
- ``abstracts``: the abstracts of the papers behind lm-evaluation-harness's tasks, as its task READMEs
  quote them (research prose about language, reasoning and benchmarks; lm-evaluation-harness is MIT
  licensed, the abstracts are quoted from their papers). They ship with this package
  (``heldout/lm_eval_abstracts.jsonl``) so that every machine reads the same text whatever lm-eval
  version it has; ``python -m replaceme_exp.data.heldout_documents`` rebuilds them from the installed
  lm-eval (:data:`MANIFEST` names the version read).

A document shorter than :data:`MIN_CHARS` is left out (a heading alone, a one-line topic), and so is one
that shares an :data:`NGRAM`-word sequence with any offline calibration text (:func:`calibration_texts`;
six pydoc sections share stock phrases with the calibration part, such as "auditing event object.__getattr__
with arguments obj and"). Within each domain the documents are shuffled once (:data:`ORDER_SEED`), and
the domains are interleaved, so the first ``n`` documents hold both domains equally.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from replaceme_exp.data.generated import SHIPPED_ANSWERS, load_prompts, shipped_entries
from replaceme_exp.data.sources import CHAT_PROMPT, HELDOUT_FRACTION, pydoc_text

FOLDER = Path(__file__).parent / "heldout"
ABSTRACTS = FOLDER / "lm_eval_abstracts.jsonl"
MANIFEST = FOLDER / "heldout_documents.json"
MIN_CHARS = 400
ORDER_SEED = 20261207
DOMAINS = ("pydoc", "abstracts")
LICENCES = {
    "pydoc": "PSF License (pydoc_data.topics, shipped with Python)",
    "abstracts": "MIT (lm-evaluation-harness task READMEs; abstracts quoted from the papers they describe)",
}
_UNDERLINE = re.compile(r"[=\-~*^\"]{3,}")
# A text sharing a sequence of this many words with a reference text overlaps it.
NGRAM = 8
_WORD = re.compile(r"[a-z0-9]+")


def ngrams(text: str, n: int = NGRAM) -> set[str]:
    """The ``n``-word sequences of ``text``: lower case, words = runs of ASCII letters and digits
    (punctuation, markup and a chat template's tokens split words and are ignored)."""
    words = _WORD.findall(text.lower())
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def calibration_texts() -> dict[str, list[str]]:
    """Every offline calibration text, by name: the pydoc calibration part (``calibration=pydoc``,
    ``pydoc_chat``, healing's ``pydoc``) and its chat prompt, the shipped instruction prompts
    (``self_generated``; ``orca_generated`` offline without a prompts file) and the embedded model's
    shipped answers to them."""
    answers = [a for entry in shipped_entries(SHIPPED_ANSWERS).values() for a in entry["value"]["answers"]]
    return {
        "pydoc_calibration": [pydoc_text("calibration"), CHAT_PROMPT],
        "shipped_prompts": load_prompts(None),
        "shipped_answers": answers,
    }


@lru_cache(maxsize=1)
def calibration_ngrams() -> frozenset[str]:
    return frozenset().union(*(ngrams(t) for texts in calibration_texts().values() for t in texts))


@dataclass(frozen=True)
class HeldoutDocument:
    """One held-out document: ``id`` (``<domain>:<name>``, unique), ``domain`` and its ``text``."""

    id: str
    domain: str
    text: str


def _heading(paragraph: str) -> str | None:
    """The title of a paragraph that opens with a reStructuredText heading (a line underlined)."""
    lines = paragraph.split("\n")
    if len(lines) >= 2 and lines[0].strip() and _UNDERLINE.fullmatch(lines[1].strip()):
        return lines[0].strip()
    return None


def pydoc_sections() -> list[HeldoutDocument]:
    """The held-out part of ``pydoc_data.topics`` (the paragraphs after the calibration part's 80%,
    those also in the calibration part dropped, as :func:`~replaceme_exp.data.sources.pydoc_text`),
    cut into sections: a new document at each topic and at each heading; a section whose text repeats
    an earlier one (two topics share some) is left out."""
    from pydoc_data.topics import topics

    paragraphs = [(key, p.strip()) for key in sorted(topics) for p in re.split(r"\n\s*\n", topics[key]) if p.strip()]
    total = sum(len(p) for _, p in paragraphs)
    cut, seen = 0, 0
    while seen < total * (1 - HELDOUT_FRACTION):
        seen += len(paragraphs[cut][1])
        cut += 1
    calibration = {p for _, p in paragraphs[:cut]}
    sections: list[tuple[str, str, list[str]]] = []
    for key, paragraph in paragraphs[cut:]:
        if paragraph in calibration:
            continue
        title = _heading(paragraph)
        if not sections or sections[-1][0] != key or title is not None:
            sections.append((key, title or key, []))
        sections[-1][2].append(paragraph)
    out, texts, names = [], set(), set()
    for key, title, body in sections:
        text = "\n\n".join(body)
        if text in texts:
            continue
        texts.add(text)
        name = f"{key}/{title}"
        while name in names:
            name += "'"
        names.add(name)
        out.append(HeldoutDocument(f"pydoc:{name}", "pydoc", text))
    return out


def abstract_documents(path: Path = ABSTRACTS) -> list[HeldoutDocument]:
    """The shipped abstracts (``heldout/lm_eval_abstracts.jsonl``)."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [HeldoutDocument(f"abstracts:{r['id']}", "abstracts", r["text"]) for r in records]


def domain_documents(domain: str) -> list[HeldoutDocument]:
    """The documents of one domain of at least :data:`MIN_CHARS` characters that overlap no calibration
    text, in the shipped order (shuffled once by :data:`ORDER_SEED`)."""
    found = pydoc_sections() if domain == "pydoc" else abstract_documents()
    reference = calibration_ngrams()
    kept = [d for d in found if len(d.text) >= MIN_CHARS and not ngrams(d.text) & reference]
    random.Random(f"{ORDER_SEED}:{domain}").shuffle(kept)
    return kept


def heldout_documents(domains: tuple[str, ...] = DOMAINS) -> list[HeldoutDocument]:
    """Every held-out document of ``domains``, the domains interleaved (one of each in turn while
    each has documents left)."""
    lists = [domain_documents(d) for d in domains]
    out = []
    for i in range(max(len(docs) for docs in lists)):
        out += [docs[i] for docs in lists if i < len(docs)]
    return out


# --- the builder of the shipped abstracts --------------------------------------------------------

BUILDER_VERSION = 1
_ABSTRACT = re.compile(r"^\s*Abstract\s*:", re.IGNORECASE)
_MARKUP = re.compile(r"`|\*\*|^\s*>\s?", re.MULTILINE)  # code quotes, bold, block quotes
_STOP = re.compile(r"^\s*(Homepage|#|```|\|)", re.IGNORECASE)


def readme_abstract(readme: str) -> str | None:
    """The prose after a task README's ``Abstract:`` line, up to its homepage, next heading, code or
    table: paragraphs of at least 20 words that hold no link, without markdown's quotes and bold. None
    when there is none."""
    lines = readme.splitlines()
    start = next((i for i, line in enumerate(lines) if _ABSTRACT.match(line)), None)
    if start is None:
        return None
    first = _ABSTRACT.sub("", lines[start]).strip()
    body = [first] if first else []
    for line in lines[start + 1 :]:
        if _STOP.match(line):
            break
        body.append(line.strip())
    paragraphs = [" ".join(_MARKUP.sub("", p).split()) for p in re.split(r"\n\s*\n", "\n".join(body))]
    prose = [p for p in paragraphs if len(p.split()) >= 20 and "http" not in p and "](" not in p]
    return "\n\n".join(prose) or None


def build_abstracts(tasks_dir: Path) -> list[dict]:
    """``{id, text}`` for each task README under ``tasks_dir`` (lm-eval's ``tasks`` folder) that
    quotes an abstract, by folder name; an abstract quoted by several READMEs is kept once (its first
    folder in sorted order)."""
    out, seen = [], set()
    for readme in sorted(tasks_dir.glob("*/README.md")):
        text = readme_abstract(readme.read_text(encoding="utf-8", errors="replace"))
        if text is None or text in seen or not text.isascii():
            continue
        seen.add(text)
        out.append({"id": readme.parent.name, "text": text})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Rebuild the shipped held-out abstracts from the installed lm-eval")
    parser.add_argument("--out", default=str(FOLDER))
    args = parser.parse_args(argv)
    import lm_eval

    try:
        lm_eval_version = version("lm_eval")
    except PackageNotFoundError:
        lm_eval_version = None
    records = build_abstracts(Path(lm_eval.__file__).parent / "tasks")
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records).encode()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ABSTRACTS.name).write_bytes(data)
    manifest = {
        "builder_version": BUILDER_VERSION,
        "sources": {"lm_eval": lm_eval_version, "python": ".".join(map(str, sys.version_info[:3]))},
        "licences": LICENCES,
        "abstracts": {"file": ABSTRACTS.name, "documents": len(records), "sha256": hashlib.sha256(data).hexdigest()},
    }
    (out / MANIFEST.name).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(records)} abstracts from lm-eval {lm_eval_version} -> {out / ABSTRACTS.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
