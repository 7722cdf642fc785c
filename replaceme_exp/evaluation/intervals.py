"""How sure a recorded number is, and whether two rows scored on the same units differ.

The units are what a score averages over and what can be resampled: the **windows** of the held-out
perplexity and the **items** of an lm-eval task.

- **Held-out perplexity** is ``exp(sum of NLL / sum of tokens)`` over fixed windows. Its interval is a
  percentile bootstrap over windows (windows drawn with replacement, the ratio recomputed). The
  window, not the token, is the unit: the tokens of one window share its context and its topic, so a
  standard error of the per-token loss would count thousands of correlated tokens as independent
  and understate the uncertainty.
- **A task's accuracy** keeps lm-eval's standard error (``sample std / sqrt(n)`` over its items).
  ``avg_acc``, a mean of task means, gets a bootstrap over each task's items (stratified by task).
- **Two rows on the same units** (the same windows of the same tokens, the same items) are compared
  by a paired bootstrap: the same resampled units for both rows, so what both models find hard
  cancels. The difference is within noise (a tie) when its interval contains 0.
- **Two rows on different units** (or several seeds averaged) fall back to an unpaired comparison:
  a tie when the difference is within ``z`` combined standard errors.

Every function is deterministic: resamples are drawn from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
RESAMPLES = 5000
SEED = 0
_CHUNK = 500  # resamples drawn at once ...
_GATHERED = 4_000_000  # ... at most this many gathered values (resamples x units x quantities) at once


def z_value(level: float = LEVEL) -> float:
    """The two-sided normal quantile of ``level`` (1.96 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


def resampled_sums(values: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Bootstrap sums: ``values`` (k, n) holds k quantities over n units; each resample draws n units
    with replacement (the same draw for all k quantities: paired).

    Returns (resamples, k): each row the k sums over one resample."""
    values = np.asarray(values, dtype=np.float64)
    k, n = values.shape
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, k))
    chunk = max(1, min(_CHUNK, _GATHERED // (n * k)))
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        drawn = rng.integers(0, n, size=(size, n))  # (size, n) unit indices
        out[start : start + size] = values[:, drawn].sum(axis=-1).T
    return out


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
    low, high = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def perplexity_interval(
    nll: np.ndarray, tokens: np.ndarray, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The percentile bootstrap interval of ``exp(sum nll / sum tokens)`` over windows.

    ``nll`` (windows,): each window's summed next-token NLL in nats; ``tokens`` (windows,): its
    predicted tokens. Returns (low, high)."""
    sums = resampled_sums(np.stack([nll, tokens]), resamples, seed)
    return _percentiles(np.exp(sums[:, 0] / sums[:, 1]), level)


def stratified_means(items: list[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Bootstrap replicates of the mean over tasks of each task's mean item value, each task's items
    resampled on their own. ``items``: one (n_task,) array per task. Returns (resamples,)."""
    total = np.zeros(resamples)
    for offset, values in enumerate(items):
        values = np.asarray(values, dtype=np.float64)
        total += resampled_sums(values[None, :], resamples, seed + offset)[:, 0] / len(values)
    return total / len(items)


def mean_interval(
    items: list[np.ndarray], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The percentile interval of a mean of task means (``avg_acc``) over a stratified bootstrap of
    the items (:func:`stratified_means`). Returns (low, high)."""
    return _percentiles(stratified_means(items, resamples, seed), level)


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: ``estimate`` the difference (for perplexities the log of their ratio),
    ``low`` / ``high`` its interval, ``method`` how it was obtained and ``units`` how many windows or
    items it rests on (None for unpaired)."""

    estimate: float
    low: float
    high: float
    method: str
    units: int | None = None

    @property
    def tie(self) -> bool:
        """Whether the difference is within noise: its interval contains 0."""
        return self.low <= 0.0 <= self.high


def paired_perplexity(
    nll_a: np.ndarray,
    nll_b: np.ndarray,
    tokens: np.ndarray,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Comparison:
    """``log(ppl_a / ppl_b)`` with its paired bootstrap interval over the windows both were scored
    on (``tokens`` (windows,) the windows' predicted tokens, the same for both)."""
    nll_a, nll_b, tokens = (np.asarray(x, dtype=np.float64) for x in (nll_a, nll_b, tokens))
    estimate = (nll_a.sum() - nll_b.sum()) / tokens.sum()
    sums = resampled_sums(np.stack([nll_a - nll_b, tokens]), resamples, seed)
    low, high = _percentiles(sums[:, 0] / sums[:, 1], level)
    return Comparison(float(estimate), low, high, "paired bootstrap over windows", len(tokens))


def paired_means(
    items_a: list[np.ndarray],
    items_b: list[np.ndarray],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Comparison:
    """The difference of two means of task means (``avg_acc``, or one task's score) over the same
    items, with its paired, stratified bootstrap interval. ``items_a`` / ``items_b``: one array per
    task, item by item in the same order."""
    differences = []
    for a, b in zip(items_a, items_b):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"paired items differ in number: {a.shape} against {b.shape}")
        differences.append(a - b)
    estimate = float(np.mean([d.mean() for d in differences]))
    low, high = _percentiles(stratified_means(differences, resamples, seed), level)
    units = sum(len(d) for d in differences)
    return Comparison(estimate, low, high, "paired bootstrap over items", units)


def unpaired(value_a: float, se_a: float, value_b: float, se_b: float, level: float = LEVEL) -> Comparison:
    """``a - b`` with the interval ``± z sqrt(se_a^2 + se_b^2)`` (units scored apart, or seed means)."""
    half = z_value(level) * math.sqrt(se_a**2 + se_b**2)
    estimate = value_a - value_b
    return Comparison(estimate, estimate - half, estimate + half, "unpaired, normal approximation")


def stderr_from_interval(low: float, high: float, level: float = LEVEL) -> float:
    """The standard error a normal interval ``[low, high]`` of ``level`` implies."""
    return (high - low) / (2 * z_value(level))
