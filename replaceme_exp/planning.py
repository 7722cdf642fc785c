"""Which captures a job needs and how many passes they take: selection distances over the
candidate cuts and least-squares statistics of the chosen cuts, from the cache where present."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from replaceme_exp.capture import CutDistances, LinearStatistics, run_capture
from replaceme_exp.capture.execution import DEFAULT_STATS_GB, GIB, capture_precision, gib
from replaceme_exp.capture.runner import input_device
from replaceme_exp.capture.similarity import CCA_RIDGE, SIMILARITY_METRICS, SimilarityStatistics
from replaceme_exp.capture.statistics import DISTANCE_METRICS
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.least_squares import ls_residuals
from replaceme_exp.selection import candidate_cuts, cut_length, select_cuts, validate_cuts

log = logging.getLogger(__name__)


SELECTION_METRICS = ("cosine", "angular", "l2", "ls_residual", "cka", "cca")
WHOLE_SEQUENCE_METRICS = ("ls_residual", "cka", "cca")  # defined over all tokens only


def selection_metric_name(selection: DictConfig) -> str:
    """``cosine``, ``l2``, ``ls_residual``, ...; ``_last`` when only last tokens count."""
    if selection.metric not in SELECTION_METRICS:
        raise ConfigError("selection.metric", selection.metric, f"choose one of {SELECTION_METRICS}")
    if selection.tokens not in ("all", "last"):
        raise ConfigError("selection.tokens", selection.tokens, "choose all or last")
    if selection.metric in WHOLE_SEQUENCE_METRICS and selection.tokens != "all":
        raise ConfigError(
            "selection.tokens", selection.tokens, f"selection.metric={selection.metric} is computed over all tokens"
        )
    return selection.metric if selection.tokens == "all" else f"{selection.metric}_last"


def selection_distances(cfg, adapter, calibration, cache, candidates, needs_stats, timer, extra_statistics=()):
    """Distance of every candidate cut under ``cfg.selection`` (cached), and, when one pass
    gathered them, the LS statistics of every candidate. ``extra_statistics`` ride along when a
    pass runs. Returns (distances, {cut: stats})."""
    metric = cfg.selection.metric
    rule = TokenRule.from_config(cfg.get("estimation"))
    precision = capture_precision(cfg)
    device = input_device(adapter)
    length = candidates[0][1] - candidates[0][0]
    criterion = selection_metric_name(cfg.selection)
    if metric == "ls_residual":
        criterion += f"/alpha={float(cfg.alpha)}/{cfg.lt_placement}/tokens={rule.key()}"
    if metric == "cca":
        criterion += f"/ridge={CCA_RIDGE}"
    if metric in WHOLE_SEQUENCE_METRICS and precision != "float64":
        criterion += f"/{precision}"
    if (distances := cache.get_distances(length, criterion)) is not None:
        log.info("selection distances (%s) found in the cache", criterion)
        return distances, {}
    cut_distances = CutDistances(candidates, metric, cfg.selection.tokens) if metric in DISTANCE_METRICS else None
    similarity = None
    if metric in SIMILARITY_METRICS:
        similarity = SimilarityStatistics(candidates, adapter.hidden_size, device, precision)
        matrices = len(similarity.grams) + len(candidates)
        size = gib(matrices * adapter.hidden_size**2 * 8)
        log.info("%s selection: %d d x d float64 moments (%s)", metric, matrices, size)
    execution = getattr(adapter, "execution", None)
    if metric == "ls_residual":
        groups = candidate_groups(cfg.capture, adapter.hidden_size, candidates, execution)
    else:
        fit = needs_stats and all_candidates_fit(cfg.capture, adapter.hidden_size, len(candidates), execution)
        groups = [candidates] if fit else []
    stats, distances = {}, {}
    for i, group in enumerate(groups or [[]]):
        linear = (
            LinearStatistics(group, adapter.hidden_size, device, cfg.lt_placement, rule, precision) if group else None
        )
        first = [s for s in (cut_distances, similarity) if s is not None] + list(extra_statistics) if i == 0 else []
        label = "capture (selection)" if len(groups) < 2 else f"capture (selection, {i + 1}/{len(groups)})"
        with timer("capture", label):
            run_capture(adapter, calibration, first + ([linear] if linear is not None else []), desc=label)
        group_stats = linear.result() if linear is not None else {}
        if empty := [list(cut) for cut, s in group_stats.items() if s.n_tokens == 0]:
            raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cuts {empty}")
        if metric == "ls_residual":
            with timer("estimate", "selection (ls residuals)"):
                distances.update(ls_residuals(group_stats, float(cfg.alpha)))
        if len(groups) == 1:  # kept for the chosen cuts only when one pass gathered every candidate
            stats = group_stats
    if similarity is not None:
        with timer("estimate", f"selection ({metric})"):
            distances = similarity.distances(metric)
    elif cut_distances is not None:
        distances = cut_distances.result()
    cache.put_distances(length, criterion, distances)
    return distances, stats


def capture_calibration(
    cfg,
    adapter,
    calibration,
    cache,
    needs_stats,
    timer,
    compute_missing=True,
    extra_statistics=(),
    stats_batches=None,
    stats_cache=None,
):
    """Distances for selection (when ``cuts`` is null) and statistics for the chosen cuts, from
    the cache where present, otherwise in as few passes as the plan allows. With
    ``compute_missing=False`` statistics that are neither cached nor gathered by the selection
    pass are left out (a later pass over the same data, e.g. the token capture, adds them).
    ``extra_statistics`` (e.g. :class:`LayerDistances`) join the selection pass when one runs.
    ``stats_batches`` / ``stats_cache``: other data for the statistics than for the selection
    (the calibration set with masked copies, ``mask_ratio > 0``) and their cache; the selection
    pass then gathers no statistics.

    Returns (cuts, distances or None, {cut: LinearStats}).
    """
    num_layers = adapter.num_layers
    distances = None
    stats = {}
    separate_data = stats_batches is not None and stats_batches is not calibration
    stats_batches = calibration if stats_batches is None else stats_batches
    stats_cache = cache if stats_cache is None else stats_cache
    rule = TokenRule.from_config(cfg.get("estimation"))
    if cfg.cuts is not None:
        cuts = validate_cuts(OmegaConf.to_container(cfg.cuts), num_layers, bool(cfg.merge_consecutive))
    else:
        candidates = candidate_cuts(num_layers, cut_length(cfg.n_prune, cfg.num_lts, num_layers))
        distances, stats = selection_distances(
            cfg, adapter, calibration, cache, candidates, needs_stats and not separate_data, timer, extra_statistics
        )
        if separate_data:  # selection statistics (ls_residual) are of the plain data, not the estimation data
            stats = {}
        cuts = select_cuts(distances, cfg.num_lts, bool(cfg.merge_consecutive))
        log.info("selected cuts %s", cuts)
    if not needs_stats:
        return cuts, distances, {}
    found = {}
    precision = capture_precision(cfg)
    for cut in cuts:
        if cut in stats:
            found[cut] = stats[cut]
            stats_cache.put_stats(stats[cut], cfg.lt_placement, rule.key(), precision)
        elif (cached := stats_cache.get_stats(cut, cfg.lt_placement, rule.key(), precision)) is not None:
            log.info("statistics of cut %s found in the cache", list(cut))
            found[cut] = cached
    missing = [cut for cut in cuts if cut not in found]
    if missing and compute_missing:
        accumulator = LinearStatistics(
            missing, adapter.hidden_size, input_device(adapter), cfg.lt_placement, rule, precision
        )
        with timer("capture", "capture (statistics)"):
            run_capture(adapter, stats_batches, [accumulator], desc="capture (statistics)")
        if empty := [list(cut) for cut, s in accumulator.result().items() if s.n_tokens == 0]:
            raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cuts {empty}")
        for cut, s in accumulator.result().items():
            stats_cache.put_stats(s, cfg.lt_placement, rule.key(), precision)
            found[cut] = s
    return cuts, distances, found


def stats_budget(capture_cfg: DictConfig, execution=None) -> float:
    """Bytes the LS statistics of one pass may take: ``capture.max_stats_gb`` when set, else the
    plan's measured budget (:func:`~replaceme_exp.capture.execution.plan_execution`), else 8 GiB."""
    if capture_cfg.get("max_stats_gb") is not None:
        return float(capture_cfg.max_stats_gb) * GIB
    if execution is not None:
        return float(execution.stats_bytes)
    return DEFAULT_STATS_GB * GIB


def cut_stats_bytes(hidden: int) -> int:
    """One cut's LS statistics: ``M^T M`` and ``M^T R``, two d x d float64 matrices (candidates
    of one length have distinct starts, so each has its own ``M^T M`` whatever the token rule)."""
    return 2 * hidden * hidden * 8


def all_candidates_fit(capture_cfg: DictConfig, hidden: int, n_candidates: int, execution=None) -> bool:
    """Whether one pass may accumulate the statistics of every candidate cut within the budget
    (:func:`stats_budget`); ``capture.passes`` forces one or two. Logs the choice and why."""
    mode = capture_cfg.passes
    if mode not in ("auto", "one", "two"):
        raise ConfigError("capture.passes", mode, "choose auto, one or two")
    need, budget = n_candidates * cut_stats_bytes(hidden), stats_budget(capture_cfg, execution)
    fits = mode == "one" or (mode == "auto" and need <= budget)
    why = f"capture.passes={mode}" if mode != "auto" else f"{gib(need)} {'within' if fits else 'over'} {gib(budget)}"
    log.info(
        "capture plan: %s (statistics of %d candidate cuts: %s)",
        "one pass" if fits else "two passes",
        n_candidates,
        why,
    )
    return fits


def candidate_groups(capture_cfg: DictConfig, hidden: int, candidates: list, execution=None) -> list[list]:
    """The candidates of an ``ls_residual`` selection split into groups whose statistics fit the
    budget, one capture pass each (all in one group with ``capture.passes=one``)."""
    per_cut, budget = cut_stats_bytes(hidden), stats_budget(capture_cfg, execution)
    size = len(candidates) if capture_cfg.passes == "one" else max(1, min(len(candidates), int(budget // per_cut)))
    groups = [candidates[i : i + size] for i in range(0, len(candidates), size)]
    if len(groups) > 1:
        log.info(
            "capture plan: ls_residual selection in %d passes of %d candidates (%s each, budget %s)",
            len(groups),
            size,
            gib(size * per_cut),
            gib(budget),
        )
    return groups
