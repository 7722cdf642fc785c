"""What a task's items can show: its floors (chance, and the trivial baseline that always gives the
answer most frequent elsewhere in the set), its item clusters, and whether a score sits at the floor or
near the ceiling.

Read from lm-eval's logged samples (``log_samples``), so it holds for any task: a multiple-choice item
is scored by log-likelihood over its choices (two or more requests, each's ``arguments`` a ``(context,
continuation)`` pair, the continuations its choices, ``target`` the gold choice's index or text); an
answer that must be produced exactly (one continuation scored by greedy match, as LAMBADA and the
docstring cloze, or ``generate_until``) has no choices and its ``target`` is the gold text.

- **chance**: the mean over items of ``1 / number of choices``; None for generated answers (guessing a
  free-form answer exactly is about 0).
- **majority** (the trivial baseline): for each item, the answer most frequent among the gold answers of
  the *other* items of the set (leave-one-out, so an item's own answer does not vote for itself), among
  its choices where it has them; ties are broken at random (the item counts ``1 / tied answers`` when its
  gold is among them). A set whose answers repeat (the world facts' currencies: "Euro" 35 times) scores
  far above chance this way.
- **clusters**: items that test the same thing (``eval.harness.clusters``: ``answer``, items with the same
  gold answer) are resampled together by the intervals; each item's cluster as an integer, in the order
  the clusters first appear.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

# A score this close to 1 (the mean of a task whose items score 0 or 1) leaves a pruned model little to
# show above it and an unpruned one nothing: near its ceiling.
CEILING = 0.9
FLOOR, NEAR_CEILING = "floor", "ceiling"


@dataclass(frozen=True)
class Item:
    """One scored item: its gold answer's text and its choices' texts (None: a generated answer)."""

    gold: str
    choices: tuple[str, ...] | None


def _argument_pair(argument: Any) -> tuple[Any, Any] | None:
    """A request's arguments as ``(context, continuation)`` when it is a log-likelihood request."""
    if isinstance(argument, dict):  # lm-eval's serialised form: {"arg_0": ..., "arg_1": ...}
        argument = [argument[k] for k in sorted(argument)]
    if isinstance(argument, (list, tuple)) and len(argument) == 2:
        return argument[0], argument[1]
    return None


def item_of(sample: dict) -> Item:
    """The gold answer and choices of one logged sample."""
    pairs = [_argument_pair(a) for a in sample.get("arguments") or []]
    target = sample.get("target")
    if len(pairs) > 1 and all(p is not None and isinstance(p[1], str) for p in pairs):
        choices = tuple(p[1].strip() for p in pairs)
        if isinstance(target, (int, float)) and not isinstance(target, bool) and 0 <= int(target) < len(choices):
            return Item(choices[int(target)], choices)
        if isinstance(target, list) and target and isinstance(target[0], int):
            return Item(choices[target[0]], choices)
        return Item(str(target).strip(), choices)
    if isinstance(target, list):
        target = target[0] if target else ""
    return Item(str(target).strip(), None)


def chance(items: list[Item]) -> float | None:
    """The mean of ``1 / choices`` over the items; None when they have no choices (generated answers)."""
    if not items or any(i.choices is None for i in items):
        return None
    return sum(1.0 / len(i.choices) for i in items) / len(items)


def majority(items: list[Item]) -> float | None:
    """The expected accuracy of the leave-one-out most-frequent-answer baseline (module docstring)."""
    if len(items) < 2:
        return None
    counts = Counter(i.gold for i in items)
    total = 0.0
    for item in items:
        candidates = item.choices if item.choices is not None else tuple(counts)

        def votes(answer: str) -> int:
            return counts[answer] - (answer == item.gold)

        best = max(votes(a) for a in candidates)
        tied = [a for a in dict.fromkeys(candidates) if votes(a) == best]
        total += (item.gold in tied) / len(tied)
    return total / len(items)


def cluster_codes(items: list[Item], kind: str) -> list[int]:
    """Each item's cluster (``kind``: ``answer``), numbered in order of first appearance."""
    if kind != "answer":
        raise ValueError(f"unknown item cluster kind {kind!r}")
    index: dict[str, int] = {}
    return [index.setdefault(i.gold, len(index)) for i in items]


def score_range(score: float | None, low: float | None, floor: float | None) -> str | None:
    """``floor`` when the score's interval reaches down to the task's floor (``low <= floor``),
    ``ceiling`` when the score is at least :data:`CEILING`; None otherwise or when unknown."""
    if score is None:
        return None
    if floor is not None and low is not None and low <= floor:
        return FLOOR
    if score >= CEILING:
        return NEAR_CEILING
    return None
