"""Which captures a job needs and how many passes they take: selection distances over the
candidate cuts and least-squares statistics of the chosen cuts, from the cache where present."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from replaceme_exp.capture import CutDistances, LinearStatistics, run_capture
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
    length = candidates[0][1] - candidates[0][0]
    criterion = selection_metric_name(cfg.selection)
    if metric == "ls_residual":
        criterion += f"/alpha={float(cfg.alpha)}/{cfg.lt_placement}/tokens={rule.key()}"
    if metric == "cca":
        criterion += f"/ridge={CCA_RIDGE}"
    if (distances := cache.get_distances(length, criterion)) is not None:
        log.info("selection distances (%s) found in the cache", criterion)
        return distances, {}
    cut_distances = CutDistances(candidates, metric, cfg.selection.tokens) if metric in DISTANCE_METRICS else None
    similarity = None
    if metric in SIMILARITY_METRICS:
        similarity = SimilarityStatistics(candidates, adapter.hidden_size, input_device(adapter))
        matrices = len(similarity.grams) + len(candidates)
        gib = matrices * adapter.hidden_size**2 * 8 / 2**30
        log.info("%s selection: %d d x d float64 moments (%.2f GiB)", metric, matrices, gib)
    all_stats = metric == "ls_residual" or (
        needs_stats and all_candidates_fit(cfg.capture, adapter.hidden_size, len(candidates))
    )
    linear = (
        LinearStatistics(candidates, adapter.hidden_size, input_device(adapter), cfg.lt_placement, rule)
        if all_stats
        else None
    )
    statistics = [s for s in (cut_distances, similarity, linear) if s is not None] + list(extra_statistics)
    with timer("capture", "capture (selection)"):
        run_capture(adapter, calibration, statistics, desc="capture (selection)")
    stats = linear.result() if linear is not None else {}
    if empty := [list(cut) for cut, s in stats.items() if s.n_tokens == 0]:
        raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cuts {empty}")
    if metric == "ls_residual":
        with timer("estimate", "selection (ls residuals)"):
            distances = ls_residuals(stats, float(cfg.alpha))
    elif similarity is not None:
        with timer("estimate", f"selection ({metric})"):
            distances = similarity.distances(metric)
    else:
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
    for cut in cuts:
        if cut in stats:
            found[cut] = stats[cut]
            stats_cache.put_stats(stats[cut], cfg.lt_placement, rule.key())
        elif (cached := stats_cache.get_stats(cut, cfg.lt_placement, rule.key())) is not None:
            log.info("statistics of cut %s found in the cache", list(cut))
            found[cut] = cached
    missing = [cut for cut in cuts if cut not in found]
    if missing and compute_missing:
        accumulator = LinearStatistics(missing, adapter.hidden_size, input_device(adapter), cfg.lt_placement, rule)
        with timer("capture", "capture (statistics)"):
            run_capture(adapter, stats_batches, [accumulator], desc="capture (statistics)")
        if empty := [list(cut) for cut, s in accumulator.result().items() if s.n_tokens == 0]:
            raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cuts {empty}")
        for cut, s in accumulator.result().items():
            stats_cache.put_stats(s, cfg.lt_placement, rule.key())
            found[cut] = s
    return cuts, distances, found


def all_candidates_fit(capture_cfg: DictConfig, hidden: int, n_candidates: int) -> bool:
    """Whether one pass may accumulate the statistics of every candidate cut (two d x d float64
    matrices each: candidates of one length have distinct starts, so each has its own ``M^T M``
    whatever the token rule) within ``capture.max_stats_gb``; ``capture.passes`` forces one or two."""
    mode = capture_cfg.passes
    if mode == "one":
        return True
    if mode == "two":
        return False
    if mode != "auto":
        raise ConfigError("capture.passes", mode, "choose auto, one or two")
    return 2 * n_candidates * hidden * hidden * 8 / 2**30 <= float(capture_cfg.max_stats_gb)
