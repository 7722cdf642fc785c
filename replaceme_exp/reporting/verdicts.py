"""How a comparison reads against a margin fixed in advance: ahead, level within the margin, behind, or
inconclusive.

A comparison (:class:`~replaceme_exp.intervals.Comparison`) holds ``a - reference`` (for a
perplexity or a speedup the log of their ratio) and its interval. With ``d`` that difference turned so that
positive is better and ``[L, H]`` its interval, and the margin ``m`` (``log(ratio)`` for ratios):

- **ahead**: ``L > 0`` (better, beyond noise);
- **level**: ``L >= -m`` and not ahead (non-inferior: a deficit larger than the margin is excluded);
- **behind**: ``H < 0`` and ``L < -m`` (worse beyond noise, and not shown to be within the margin);
- **inconclusive**: ``L < -m`` and ``H >= 0``: the interval is too wide to say (it reaches past the
  margin on the side that matters and past 0 on the other).

"The interval covers 0" is no longer a verdict: a wider interval would make it easier to reach, not
harder. The margins live in ``margins.yaml`` beside this module, dated, so that they are fixed before
the runs they judge (docs/methods/README.md#how-comparisons-read).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import yaml

from replaceme_exp.intervals import Comparison

MARGINS_FILE = Path(__file__).with_name("margins.yaml")
AHEAD, LEVEL, BEHIND, INCONCLUSIVE = "ahead", "level", "behind", "inconclusive"
VERDICTS = (AHEAD, LEVEL, BEHIND, INCONCLUSIVE)


@lru_cache(maxsize=1)
def shipped_margins() -> dict[str, dict]:
    return yaml.safe_load(MARGINS_FILE.read_text())


def margin_entry(metric: str, margins: dict[str, dict] | None = None) -> dict | None:
    """The margin of ``metric``: its own entry, else the first entry that is a prefix (``score_``) or a
    suffix (``_speedup``) of it; None when it has none."""
    margins = shipped_margins() if margins is None else margins
    if metric in margins:
        return margins[metric]
    for key, entry in margins.items():
        if (key.endswith("_") and metric.startswith(key)) or (key.startswith("_") and metric.endswith(key)):
            return entry
    return None


def margin_on_comparison_scale(metric: str, margins: dict[str, dict] | None = None) -> float | None:
    """The margin as a comparison measures it: ``log(value)`` for a ratio, ``value`` for a difference."""
    entry = margin_entry(metric, margins)
    if entry is None:
        return None
    value = float(entry["value"])
    if entry["kind"] == "ratio":
        if value <= 1:
            raise ValueError(f"margin of {metric}: a ratio must exceed 1, not {value}")
        return math.log(value)
    if value <= 0:
        raise ValueError(f"margin of {metric}: a difference must be positive, not {value}")
    return value


def margin_text(metric: str, margins: dict[str, dict] | None = None) -> str:
    """The margin as a reader states it: ``ratio 1.05`` or ``2.0 points``."""
    entry = margin_entry(metric, margins)
    if entry is None:
        return "none"
    if entry["kind"] == "ratio":
        return f"ratio {float(entry['value']):g}"
    return f"{100 * float(entry['value']):g} points"


def read(comparison: Comparison, higher_is_better: bool, margin: float) -> str:
    """The verdict of ``comparison`` (``a - reference``; ``higher_is_better``: which sign is better) against
    ``margin`` (on the comparison's scale, positive)."""
    sign = 1.0 if higher_is_better else -1.0
    low, high = sorted((sign * comparison.low, sign * comparison.high))
    if low > 0:
        return AHEAD
    if low >= -margin:
        return LEVEL
    if high < 0:
        return BEHIND
    return INCONCLUSIVE
