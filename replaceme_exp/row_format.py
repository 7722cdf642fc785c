"""The row's published format: how the measured columns are named and how their cells are written and
read back. The stages that write a row and the reports that read it both stand on this module, so that
reporting reads rows, registries and this format, never a constant of a stage (pyproject.toml's
contract "reporting reads rows and registries")."""

from __future__ import annotations

import json
import math
from typing import Any

# Metrics recorded as ``ppl_<name>`` (name from ``eval.harness.ppl_names``, else the task); a task
# that declares one of them is left out of ``avg_acc``.
PERPLEXITY_METRICS = ("perplexity", "word_perplexity")

# Fewer tokens than this many per dimension leave mean CCA / PWCCA visibly biased (two independent
# Gaussians in d = 64 score 0.64 at 2 d tokens, 0.27 at 10 d, 0.12 at 50 d, 0.04 at 500 d;
# docs/guides/selection-cka-cca.md): the row says so (``similarity_undersampled_<data>``).
MIN_TOKENS_PER_DIM = 50


def metric_column(task: str, metric: str, ppl_names: dict[str, str] | None = None) -> str:
    """The row column of ``metric`` on ``task``: ``acc_norm_piqa``; ``ppl_<name>`` for perplexities."""
    if metric in PERPLEXITY_METRICS:
        return f"ppl_{(ppl_names or {}).get(task, task)}"
    return f"{metric}_{task}"


def stderr_column(task: str, metric: str, ppl_names: dict[str, str] | None = None) -> str:
    """``acc_norm_stderr_piqa``, ``ppl_stderr_lambada``: the standard error of :func:`metric_column`."""
    if metric in PERPLEXITY_METRICS:
        return f"ppl_stderr_{(ppl_names or {}).get(task, task)}"
    return f"{metric}_stderr_{task}"


def encode_items(values: list[float]) -> str | list[float]:
    """Per-item values of a metric as a row cell: a string of ``0`` / ``1`` when every value is 0 or 1
    (accuracies: one character an item), else the list of values."""
    if all(v in (0.0, 1.0) for v in values):
        return "".join("1" if v else "0" for v in values)
    return [float(v) for v in values]


def decode_items(cell: Any):
    """A ``score_items_<task>`` cell (from :func:`encode_items`, or a list's JSON text read back from
    the store) as a float array (items,); None when absent."""
    import numpy as np

    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return None
    if isinstance(cell, str):
        if cell and set(cell) <= {"0", "1"}:
            return np.frombuffer(cell.encode(), dtype=np.uint8).astype(np.float64) - ord("0")
        cell = json.loads(cell)
    return np.asarray(cell, dtype=np.float64)


def window_nll_of(cell):
    """A ``*_window_nll`` cell (a list, or its JSON text from the store) as an array (windows,); None when
    absent."""
    import numpy as np

    if isinstance(cell, str):
        cell = json.loads(cell)
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return None
    return np.asarray(cell, dtype=np.float64)
