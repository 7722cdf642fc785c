"""How sure a recorded number is, and whether two rows scored on the same units differ.

The units are what a score averages over; the **clusters** are what is resampled: groups of units that
are not independent of each other. Without clusters every unit is its own cluster.

- **Held-out perplexity** is ``exp(sum of NLL / sum of tokens)`` over fixed windows. Its interval is a
  percentile bootstrap over the windows' *documents* (a cluster bootstrap: documents drawn with
  replacement, each with all its windows, the ratio recomputed). The windows of one document share its
  topic and their losses are correlated (adjacent windows of one pydoc topic: lag-1 correlation
  0.23-0.37), so resampling windows would count them as independent and understate the uncertainty, as
  resampling tokens would within a window.
- **A task's accuracy** keeps lm-eval's standard error (``sample std / sqrt(n)`` over its items).
  ``avg_acc``, a mean of task means, gets a bootstrap over each task's items (stratified by task), drawn
  by cluster where the task's items share what they test (the world facts: items with the same answer).
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


def cluster_sums(values: np.ndarray, clusters) -> np.ndarray:
    """``values`` (k, n) summed within each cluster: (k, c), clusters in order of first appearance.
    ``clusters`` (n,): any hashable label per unit; None: each unit its own cluster (``values`` itself)."""
    values = np.asarray(values, dtype=np.float64)
    if clusters is None:
        return values
    labels = list(clusters)
    if len(labels) != values.shape[1]:
        raise ValueError(f"{len(labels)} cluster labels for {values.shape[1]} units")
    index: dict = {}
    codes = np.asarray([index.setdefault(label, len(index)) for label in labels])
    out = np.zeros((values.shape[0], len(index)))
    for row in range(values.shape[0]):
        out[row] = np.bincount(codes, weights=values[row], minlength=len(index))
    return out


def resampled_sums(values: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED, clusters=None) -> np.ndarray:
    """Bootstrap sums: ``values`` (k, n) holds k quantities over n units; each resample draws as many
    clusters as there are, with replacement, each with all its units (the same draw for all k
    quantities: paired). ``clusters`` (n,): a label per unit; None: each unit its own cluster.

    Returns (resamples, k): each row the k sums over one resample."""
    values = cluster_sums(values, clusters)
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
    nll: np.ndarray,
    tokens: np.ndarray,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters=None,
) -> tuple[float, float]:
    """The percentile bootstrap interval of ``exp(sum nll / sum tokens)`` over windows, drawn by
    cluster (``clusters`` (windows,): each window's document; None: each window alone).

    ``nll`` (windows,): each window's summed next-token NLL in nats; ``tokens`` (windows,): its
    predicted tokens. Returns (low, high)."""
    sums = resampled_sums(np.stack([nll, tokens]), resamples, seed, clusters)
    return _percentiles(np.exp(sums[:, 0] / sums[:, 1]), level)


def stratified_means(
    items: list[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED, clusters: list | None = None
) -> np.ndarray:
    """Bootstrap replicates of the mean over tasks of each task's mean item value, each task's items
    resampled on their own. ``items``: one (n_task,) array per task; ``clusters``: per task None (each
    item alone) or a label per item (items drawn cluster by cluster; a replicate's task mean is then
    the drawn items' sum over their count). Returns (resamples,)."""
    total = np.zeros(resamples)
    clusters = clusters if clusters is not None else [None] * len(items)
    for offset, (values, labels) in enumerate(zip(items, clusters)):
        values = np.asarray(values, dtype=np.float64)
        if labels is None:
            total += resampled_sums(values[None, :], resamples, seed + offset)[:, 0] / len(values)
            continue
        sums = resampled_sums(np.stack([values, np.ones_like(values)]), resamples, seed + offset, labels)
        total += sums[:, 0] / sums[:, 1]
    return total / len(items)


def mean_interval(
    items: list[np.ndarray],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters: list | None = None,
) -> tuple[float, float]:
    """The percentile interval of a mean of task means (``avg_acc``) over a stratified bootstrap of
    the items (:func:`stratified_means`, by cluster where ``clusters`` names them). Returns (low, high)."""
    return _percentiles(stratified_means(items, resamples, seed, clusters), level)


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
    clusters=None,
) -> Comparison:
    """``log(ppl_a / ppl_b)`` with its paired bootstrap interval over the windows both were scored
    on (``tokens`` (windows,) the windows' predicted tokens, the same for both), drawn by document
    where ``clusters`` (windows,) names each window's."""
    nll_a, nll_b, tokens = (np.asarray(x, dtype=np.float64) for x in (nll_a, nll_b, tokens))
    estimate = (nll_a.sum() - nll_b.sum()) / tokens.sum()
    sums = resampled_sums(np.stack([nll_a - nll_b, tokens]), resamples, seed, clusters)
    low, high = _percentiles(sums[:, 0] / sums[:, 1], level)
    if clusters is None:
        return Comparison(float(estimate), low, high, "paired bootstrap over windows", len(tokens))
    n = len(set(clusters))
    return Comparison(float(estimate), low, high, "paired bootstrap over documents", n)


def paired_means(
    items_a: list[np.ndarray],
    items_b: list[np.ndarray],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters: list | None = None,
) -> Comparison:
    """The difference of two means of task means (``avg_acc``, or one task's score) over the same
    items, with its paired, stratified bootstrap interval. ``items_a`` / ``items_b``: one array per
    task, item by item in the same order; ``clusters``: per task None or each item's cluster label
    (:func:`stratified_means`)."""
    differences = []
    for a, b in zip(items_a, items_b):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"paired items differ in number: {a.shape} against {b.shape}")
        differences.append(a - b)
    estimate = float(np.mean([d.mean() for d in differences]))
    low, high = _percentiles(stratified_means(differences, resamples, seed, clusters), level)
    units = sum(len(d) for d in differences)
    clustered = clusters is not None and any(c is not None for c in clusters)
    method = (
        "paired bootstrap over items, by cluster where a task names them"
        if clustered
        else "paired bootstrap over items"
    )
    return Comparison(estimate, low, high, method, units)


def unpaired(value_a: float, se_a: float, value_b: float, se_b: float, level: float = LEVEL) -> Comparison:
    """``a - b`` with the interval ``± z sqrt(se_a^2 + se_b^2)`` (units scored apart, or seed means)."""
    half = z_value(level) * math.sqrt(se_a**2 + se_b**2)
    estimate = value_a - value_b
    return Comparison(estimate, estimate - half, estimate + half, "unpaired, normal approximation")


def stderr_from_interval(low: float, high: float, level: float = LEVEL) -> float:
    """The standard error a normal interval ``[low, high]`` of ``level`` implies."""
    return (high - low) / (2 * z_value(level))


# --- several variants against one reference, at once ------------------------------------------------


def _max_t(estimates: np.ndarray, replicates: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Simultaneous intervals (max-T): ``replicates`` (resamples, k) bootstrap replicates of ``estimates``
    (k,); each replicate's largest studentised deviation over the k, its ``level`` quantile times each
    estimate's bootstrap standard error. Returns (low, high), each (k,)."""
    se = replicates.std(axis=0, ddof=1)
    se = np.where(se > 0, se, np.finfo(float).tiny)
    t_max = np.max(np.abs(replicates - estimates) / se, axis=1)
    c = float(np.quantile(t_max, level))
    return estimates - c * se, estimates + c * se


def simultaneous_perplexity(
    nll_variants: list[np.ndarray],
    nll_reference: np.ndarray,
    tokens: np.ndarray,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters=None,
) -> list[Comparison]:
    """``log(ppl_v / ppl_reference)`` of each variant ``v``, with intervals that hold for all of them at
    once (``level`` jointly): the same resamples of the windows (by document where ``clusters`` names
    them) for every variant, max-T over the variants. A claim that picks the best of the variants is
    read on these intervals, which are wider than each one's own the more variants it picked from."""
    tokens = np.asarray(tokens, dtype=np.float64)
    differences = np.stack([np.asarray(v, dtype=np.float64) - np.asarray(nll_reference) for v in nll_variants])
    estimates = differences.sum(axis=1) / tokens.sum()
    sums = resampled_sums(np.vstack([differences, tokens[None, :]]), resamples, seed, clusters)
    replicates = sums[:, :-1] / sums[:, -1:]
    low, high = _max_t(estimates, replicates, level)
    units = len(tokens) if clusters is None else len(set(clusters))
    method = f"paired bootstrap, max-T simultaneous over {len(nll_variants)} variants"
    return [Comparison(float(e), float(lo), float(hi), method, units) for e, lo, hi in zip(estimates, low, high)]


def simultaneous_means(
    items_variants: list[list[np.ndarray]],
    items_reference: list[np.ndarray],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters: list | None = None,
) -> list[Comparison]:
    """The difference of each variant's mean of task means from the reference's (``items_variants``: per
    variant one array per task; ``clusters``: per task None or each item's cluster), with max-T intervals
    that hold for all variants at once (:func:`simultaneous_perplexity`)."""
    k = len(items_variants)
    clusters = clusters if clusters is not None else [None] * len(items_reference)
    replicates = np.zeros((resamples, k))
    estimates = np.zeros(k)
    for offset, (reference, labels) in enumerate(zip(items_reference, clusters)):
        reference = np.asarray(reference, dtype=np.float64)
        differences = np.stack([np.asarray(v[offset], dtype=np.float64) - reference for v in items_variants])
        estimates += differences.mean(axis=1)
        counted = np.vstack([differences, np.ones((1, differences.shape[1]))])
        sums = resampled_sums(counted, resamples, seed + offset, labels)
        replicates += sums[:, :-1] / sums[:, -1:]
    n_tasks = len(items_reference)
    estimates, replicates = estimates / n_tasks, replicates / n_tasks
    low, high = _max_t(estimates, replicates, level)
    units = sum(len(r) for r in items_reference)
    method = f"paired bootstrap over items, max-T simultaneous over {k} variants"
    return [Comparison(float(e), float(lo), float(hi), method, units) for e, lo, hi in zip(estimates, low, high)]


# --- several calibration draws of one setting: draws and evaluation units resampled together ----------


def resampled_draws(per_draw: np.ndarray, seed: int = SEED) -> np.ndarray:
    """The mean over draws of ``per_draw`` (resamples, k): in each resample the k draws themselves are
    drawn with replacement (the second level of a two-level bootstrap; the units were drawn at the first,
    the same for every draw). Returns (resamples,)."""
    per_draw = np.asarray(per_draw, dtype=np.float64)
    rng = np.random.default_rng(seed + 7919)
    idx = rng.integers(0, per_draw.shape[1], size=per_draw.shape)
    return np.take_along_axis(per_draw, idx, axis=1).mean(axis=1)


def draws_perplexity(
    nll: np.ndarray,
    tokens: np.ndarray,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters=None,
) -> tuple[float, float, float]:
    """The mean over k calibration draws of their held-out perplexities, with a two-level bootstrap
    interval: the draws and the documents (or windows) resampled. ``nll`` (k, windows): each draw's run's
    per-window NLL on the same windows. Returns (mean, low, high)."""
    nll = np.atleast_2d(np.asarray(nll, dtype=np.float64))
    tokens = np.asarray(tokens, dtype=np.float64)
    k = nll.shape[0]
    value = float(np.mean(np.exp(nll.sum(axis=1) / tokens.sum())))
    sums = resampled_sums(np.vstack([nll, tokens[None, :]]), resamples, seed, clusters)
    replicates = resampled_draws(np.exp(sums[:, :k] / sums[:, k:]), seed)
    return (value, *_percentiles(replicates, level))


def paired_draws_perplexity(
    nll_a: np.ndarray,
    nll_b: np.ndarray,
    tokens: np.ndarray,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters=None,
) -> Comparison:
    """The mean over draws of ``log(ppl_a / ppl_b)``, draw by draw (``nll_a``, ``nll_b`` (k, windows): the
    two settings' runs on the same k calibration draws, in the same order), with a two-level paired
    bootstrap: the same resampled documents for both, the draws resampled."""
    nll_a, nll_b = np.atleast_2d(nll_a).astype(np.float64), np.atleast_2d(nll_b).astype(np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    k = nll_a.shape[0]
    differences = nll_a - nll_b
    estimate = float(np.mean(differences.sum(axis=1) / tokens.sum()))
    sums = resampled_sums(np.vstack([differences, tokens[None, :]]), resamples, seed, clusters)
    low, high = _percentiles(resampled_draws(sums[:, :k] / sums[:, k:], seed), level)
    units = len(tokens) if clusters is None else len(set(clusters))
    return Comparison(estimate, low, high, f"paired two-level bootstrap over {k} draws and the documents", units)


def _per_draw_means(
    items: list[list[np.ndarray]], resamples: int, seed: int, clusters: list | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each draw's mean of task means (``items``: per draw one array per task, the same items) and its
    replicates with the same resampled items for every draw: ((k,), (resamples, k))."""
    k, n_tasks = len(items), len(items[0])
    clusters = clusters if clusters is not None else [None] * n_tasks
    estimates, replicates = np.zeros(k), np.zeros((resamples, k))
    for t in range(n_tasks):
        rows = np.stack([np.asarray(draw[t], dtype=np.float64) for draw in items])
        estimates += rows.mean(axis=1)
        sums = resampled_sums(np.vstack([rows, np.ones((1, rows.shape[1]))]), resamples, seed + t, clusters[t])
        replicates += sums[:, :k] / sums[:, k:]
    return estimates / n_tasks, replicates / n_tasks


def draws_means(
    items: list[list[np.ndarray]], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED, clusters=None
) -> tuple[float, float, float]:
    """The mean over k calibration draws of a mean of task means (``avg_acc``), with a two-level bootstrap
    interval (draws and items). Returns (mean, low, high)."""
    estimates, replicates = _per_draw_means(items, resamples, seed, clusters)
    return (float(estimates.mean()), *_percentiles(resampled_draws(replicates, seed), level))


def paired_draws_means(
    items_a: list[list[np.ndarray]],
    items_b: list[list[np.ndarray]],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    clusters: list | None = None,
) -> Comparison:
    """The mean over draws of the difference of two settings' means of task means, draw by draw, with a
    two-level paired bootstrap (the same items for both, the draws resampled)."""
    differences = [
        [np.asarray(a, float) - np.asarray(b, float) for a, b in zip(da, db)] for da, db in zip(items_a, items_b)
    ]
    estimates, replicates = _per_draw_means(differences, resamples, seed, clusters)
    low, high = _percentiles(resampled_draws(replicates, seed), level)
    units = sum(len(x) for x in items_a[0])
    method = f"paired two-level bootstrap over {len(items_a)} draws and the items"
    return Comparison(float(estimates.mean()), low, high, method, units)
