"""The capture passes of selection: the distance of every candidate cut under the selection metric
and the least-squares statistics of the chosen cuts, from the cache where present, otherwise in as
few passes over the calibration data as the statistics budget allows."""

from __future__ import annotations

import logging
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

from replaceme_exp.capture import CutDistances, LinearStatistics, distributed, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import DEFAULT_STATS_GB, GIB, CaptureExecution, gib
from replaceme_exp.capture.folds import StoredFoldedStats, linear_statistics
from replaceme_exp.capture.hooks import input_device
from replaceme_exp.capture.similarity import SimilarityStatistics
from replaceme_exp.capture.statistics import LinearStats, StoredDistances, StoredLinearStats
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.config.depth import blocks_to_prune
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.errors import ConfigError
from replaceme_exp.selection.cuts import (
    Cut,
    candidate_cuts,
    composed_cuts,
    cut_length,
    select_cuts,
    validate_cuts,
)
from replaceme_exp.selection.metrics import SelectionMetric
from replaceme_exp.selection.race import CandidateRace
from replaceme_exp.selection.search import BlockStates, SearchContext, search_stage
from replaceme_exp.selection.search_steps import SearchSteps, no_steps
from replaceme_exp.stages import stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelectionRequest:
    """What a job's selection and statistics passes need to know.

    ``cuts``: explicit cuts (None: select ``num_lts`` cuts of ``n_prune`` blocks in total by
    ``metric`` over ``tokens``); ``merge_consecutive`` / ``touching_cuts``: what happens to cuts
    that touch (:func:`~replaceme_exp.selection.cuts.select_cuts`); ``sequential``: transforms
    estimated on the partly pruned model; ``folds``: the statistics kept per fold of whole sequences
    (:class:`~replaceme_exp.capture.folds.FoldedStats`, a cache entry of their own); ``rule``,
    ``placement``, ``precision``: how the LS statistics are taken; ``alpha``: the ridge of an
    ``ls_residual`` selection; ``passes`` and ``max_stats_gb``: ``capture.passes`` and
    ``capture.max_stats_gb``; ``execution``: the capture plan (how the passes run and the statistics
    budget; None: whole-model, the default budget); ``settings`` and ``seed``: the ``selection``
    option's typed config and the job's seed (what a search reads); ``drop_candidates``:
    ``capture.drop_candidates`` (:func:`races`)."""

    cuts: list[Cut] | None
    n_prune: int | float
    num_lts: int
    merge_consecutive: bool
    metric: SelectionMetric
    tokens: str
    alpha: float
    placement: str
    rule: TokenRule
    precision: str
    passes: str = "auto"
    max_stats_gb: float | None = None
    execution: CaptureExecution | None = None
    touching_cuts: str = "apart"
    sequential: bool = False  # transforms estimated one after another on the partly pruned model
    settings: Any = None
    seed: int = 0
    extra_blocks: int = 0  # blocks a cut spans beyond those it removes (LLM-Streamline's layer: 1)
    folds: int = 0  # >= 2: the chosen cuts' statistics per fold of whole sequences (capture.folds)
    drop_candidates: bool = True  # capture.drop_candidates: a one-pass capture races the candidates (race.py)


@dataclass
class Selection:
    """The cuts a job removes, every candidate's distance (None with explicit cuts) and the LS
    statistics of the chosen cuts found or gathered (by cut). ``composed``: the cuts whose T
    composes onto a touching earlier cut's (their statistics map the whole block output,
    :func:`~replaceme_exp.selection.cuts.composed_cuts`). A selection by search: ``block_states``
    (new weights of kept blocks, by original index) and ``columns`` (what the row records of it)."""

    cuts: list[Cut]
    distances: dict[Cut, float] | None
    stats: dict[Cut, LinearStats]
    composed: frozenset[Cut] = frozenset()
    block_states: BlockStates = field(default_factory=dict)
    columns: dict[str, Any] = field(default_factory=dict)

    def placement_of(self, cut: Cut, placement: str) -> str:
        """The placement of ``cut``'s statistics in a job of ``placement``."""
        return "separate" if cut in self.composed else placement


def distance_criterion(request: SelectionRequest) -> str:
    """The cache key of a selection's distances: the metric over its tokens, and what else moves them
    (an ``ls_residual`` selection's ridge, placement and token rule; the precision of products)."""
    metric, precision = request.metric, request.precision
    criterion = metric.column_name(request.tokens)
    if metric.uses_statistics:
        criterion += f"/alpha={float(request.alpha)}/{request.placement}/tokens={request.rule.key()}"
    criterion += metric.criterion
    if metric.takes_products and precision != "float64":
        criterion += f"/{precision}"
    return criterion


def distance_accumulators(
    request: SelectionRequest, adapter, candidates: list[Cut], per_sequence: bool = False
) -> tuple[CutDistances | None, SimilarityStatistics | None]:
    """What the selection pass gathers for the metric (None: nothing of that kind): the distances of
    each candidate (``distance`` and ``sequence`` metrics; ``per_sequence``: kept per sequence too,
    for a :class:`CandidateRace`), or the moments of a ``similarity`` one."""
    metric, hidden = request.metric, adapter.hidden_size
    if metric.kind == "distance":
        return CutDistances(candidates, metric.token_distance, request.tokens, per_sequence=per_sequence), None
    if metric.kind == "sequence":
        return CutDistances(candidates, sequence_distance=metric.sequence_distance, per_sequence=per_sequence), None
    if metric.kind != "similarity":
        return None, None
    similarity = SimilarityStatistics(candidates, hidden, input_device(adapter, request.execution), request.precision)
    matrices = len(similarity.grams) + len(candidates)
    log.info("%s selection: %d d x d float64 moments (%s)", metric.name, matrices, gib(matrices * hidden**2 * 8))
    return None, similarity


def declared_accumulators(request: SelectionRequest, adapter, candidates: list[Cut]) -> list:
    """The statistics an ``accumulated`` metric declares for ``candidates`` (none for another kind)."""
    if request.metric.kind != "accumulated":
        return []
    device = input_device(adapter, request.execution)
    return list(request.metric.accumulators(candidates, adapter.hidden_size, device))


def statistics_groups(request: SelectionRequest, hidden: int, candidates: list[Cut], needs_stats: bool) -> list:
    """The candidates whose LS statistics the selection passes gather, a group per pass: an ``ls_residual``
    selection's (:func:`candidate_groups`), else all in one pass if needed and within budget, or none."""
    if request.metric.uses_statistics:
        return candidate_groups(request, hidden, candidates)
    fit = needs_stats and all_candidates_fit(request, hidden, len(candidates))
    return [candidates] if fit else []


def races(request: SelectionRequest, groups: list[list[Cut]]) -> bool:
    """Whether the one-pass capture races the candidates (:class:`CandidateRace`): with
    ``capture.drop_candidates``, when one pass gathers every candidate's statistics for a single
    cut chosen by a distance of the activations (not by the statistics themselves, an
    ``ls_residual`` selection), in one process, batch after batch through the whole model (a
    layer-wise capture runs each block over all batches before the next)."""
    execution = request.execution
    return (
        request.drop_candidates
        and len(groups) == 1
        and len(groups[0]) > 1
        and request.num_lts == 1
        and request.metric.kind in ("distance", "sequence")
        and not request.metric.uses_statistics
        and (execution is None or execution.mode == "whole")
        and distributed.shared() is None
    )


def selection_passes(
    request: SelectionRequest,
    adapter,
    calibration: TokenBatches,
    groups: list[list[Cut]],
    riders: list,
    race: CandidateRace | None = None,
) -> tuple[dict[Cut, float], dict[Cut, LinearStats]]:
    """One capture pass per group of candidates, gathering their LS statistics (one pass without any
    for no group), ``riders`` in the first. Returns the distances an ``ls_residual`` metric computes
    from the statistics and, when one pass gathered every candidate's, those statistics: of the
    candidates still in ``race`` at its end, with one."""
    metric, rule, precision = request.metric, request.rule, request.precision
    hidden, device = adapter.hidden_size, input_device(adapter, request.execution)
    keeps = race.still_in if race is not None else None
    stats, distances = {}, {}
    for i, group in enumerate(groups or [[]]):
        linear = LinearStatistics(group, hidden, device, request.placement, rule, precision, keeps) if group else None
        accumulators = (riders if i == 0 else []) + ([linear] if linear is not None else [])
        label = "capture (selection)" if len(groups) < 2 else f"capture (selection, {i + 1}/{len(groups)})"
        with stage("capture", label):
            run_capture(adapter, calibration, accumulators, desc=label, execution=request.execution)
        group_stats = linear.result() if linear is not None else {}
        if empty := [list(cut) for cut, s in group_stats.items() if s.n_tokens == 0]:
            raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cuts {empty}")
        if metric.uses_statistics:
            with stage("estimate", f"selection ({metric.name})"):
                distances.update(metric.from_statistics(group_stats, float(request.alpha)))
        if len(groups) == 1:  # kept for the chosen cuts only when one pass gathered every candidate
            stats = group_stats
    if race is not None and (dropped := set(group) - set(stats)):
        log.info(
            "capture: statistics of %d of %d candidate cuts dropped once out of the running (after %s sequences)",
            len(dropped), len(group), min(race.dropped[cut] for cut in dropped),
        )  # fmt: skip
    return distances, stats


def selection_distances(
    request: SelectionRequest,
    adapter,
    calibration: TokenBatches,
    cache: StatisticsCache,
    candidates: list[Cut],
    needs_stats: bool,
    extra_statistics=(),
) -> tuple[dict[Cut, float], dict[Cut, LinearStats]]:
    """Distance of every candidate cut under the request's metric (cached), and, when one pass
    gathered them, the LS statistics of every candidate (of those still in the running, with a
    :class:`CandidateRace`). ``extra_statistics`` ride along when a pass runs. Returns (distances,
    {cut: stats}, the row's columns of the pass: ``capture_candidates_dropped``, how many candidates'
    statistics a race dropped, None without a race)."""
    length = candidates[0][1] - candidates[0][0]
    declared = declared_accumulators(request, adapter, candidates)
    # a metric's own statistics: their kinds and versions key its distances too
    criterion = distance_criterion(request) + "".join(sorted({f"/{a.kind}@v{a.version}" for a in declared}))
    if (distances := cache.read(StoredDistances(length, criterion))) is not None:
        log.info("selection distances (%s) found in the cache", criterion)
        return distances, {}, {}
    groups = statistics_groups(request, adapter.hidden_size, candidates, needs_stats)
    racing = races(request, groups)
    cut_distances, similarity = distance_accumulators(request, adapter, candidates, per_sequence=racing)
    riders = [s for s in (cut_distances, similarity) if s is not None] + declared + list(extra_statistics)
    race = CandidateRace(cut_distances) if racing else None
    distances, stats = selection_passes(request, adapter, calibration, groups, riders, race)
    if similarity is not None:
        with stage("estimate", f"selection ({request.metric.name})"):
            distances = {cut: 1.0 - value for cut, value in request.metric.similarity(similarity).items()}
    elif cut_distances is not None:
        distances = cut_distances.result()
    elif declared:
        with stage("estimate", f"selection ({request.metric.name})"):
            distances = request.metric.distances(candidates, declared)
    cache.store(StoredDistances(length, criterion, distances))
    dropped = len(candidates) - len(stats) if race is not None else None
    return distances, stats, {"capture_candidates_dropped": dropped}


def select(
    request: SelectionRequest,
    adapter,
    calibration: TokenBatches,
    cache: StatisticsCache,
    gather_stats: bool = False,
    extra_statistics=(),
    search_steps: SearchSteps | None = None,
) -> tuple[Selection, dict[Cut, LinearStats]]:
    """The cuts: as given, found by a search (:func:`searched`), or of the lowest distance over the
    calibration data (distances from the cache where present). Returns the selection and the LS
    statistics of candidate cuts that the selection pass gathered on the way (``gather_stats``: an
    ``ls_residual`` selection's, which are the chosen cuts' statistics too; else none).
    ``extra_statistics`` (e.g. :class:`LayerDistances`) join the selection pass when one runs;
    ``search_steps``: where a greedy search keeps its finished steps (None: nowhere)."""
    num_layers = adapter.num_layers
    distances, stats, columns = None, {}, {}
    if request.cuts is None and request.metric.searches:
        found = searched(request, adapter, calibration, search_steps or no_steps())
        if found.block_states:  # merged weights: the surgery applies them as found
            return found, {}
        cuts, columns = found.cuts, found.columns
    elif request.cuts is not None:
        cuts = validate_cuts(
            [list(c) for c in request.cuts], num_layers, request.merge_consecutive, request.touching_cuts
        )
    else:
        length = cut_length(request.n_prune, request.num_lts, num_layers) + request.extra_blocks
        candidates = candidate_cuts(num_layers, length)
        if not request.metric.last_cut:
            candidates = [cut for cut in candidates if cut[1] < num_layers]
            if not candidates:
                reason = f"selection={request.metric.name} compares no cut ending at the last block; none is left"
                raise ConfigError("n_prune", request.n_prune, reason)
        distances, stats, columns = selection_distances(
            request, adapter, calibration, cache, candidates, gather_stats, extra_statistics
        )
        cuts = select_cuts(distances, request.num_lts, request.merge_consecutive, request.touching_cuts)
        log.info("selected cuts %s", cuts)
    # estimated on the unpruned model, a touching cut's T maps L_{start-1}; sequentially, on the
    # partly pruned model, it is an ordinary fused cut of that model
    composes = request.touching_cuts == "compose" and not request.merge_consecutive and not request.sequential
    composed = composed_cuts(cuts) if composes else frozenset()
    return Selection(cuts, distances, {}, composed, columns=columns), stats


def fit_over_search(selection: Selection, request: SelectionRequest) -> None:
    """A transform over each run of the blocks a search removed (``metric.fits_after``) is fused into
    the block before the run: refused when the search removed block 0."""
    if any(start == 0 for start, _ in selection.cuts):
        end = next(e for s, e in selection.cuts if s == 0)
        reason = (
            f"removed block 0 (cut [0, {end})): a transform is fused into the block before its cut and "
            "no block comes before block 0 (objective=identity removes it)"
        )
        raise ConfigError("selection.metric", request.metric.name, reason)


def cached_cut_statistics(
    selection: Selection, request: SelectionRequest, cache: StatisticsCache, gathered: dict[Cut, LinearStats]
) -> dict[Cut, LinearStats]:
    """The chosen cuts' statistics that need no capture: gathered by the selection pass (kept in the
    cache, in the placement they were gathered in) or found in the cache."""
    rule, precision, placement, folds = request.rule, request.precision, request.placement, request.folds
    found = {}
    for cut in selection.cuts:
        cut_placement = selection.placement_of(cut, placement)
        if cut in gathered and cut_placement == placement:
            found[cut] = gathered[cut]
            cache.store(StoredLinearStats.of(gathered[cut], placement, rule.key(), precision))
        elif (cached := cached_stats(cache, cut, cut_placement, rule, precision, folds)) is not None:
            log.info("statistics of cut %s found in the cache", list(cut))
            found[cut] = cached
    return found


def capture_cut_statistics(
    cuts: list[Cut], selection: Selection, request: SelectionRequest, adapter, batches: TokenBatches
) -> dict[str, dict[Cut, LinearStats]]:
    """The LS statistics of ``cuts`` in one capture pass over ``batches``, by the placement each is
    fitted in (``{placement: {cut: statistics}}``, per fold with ``request.folds``)."""
    rule, precision, placement, folds = request.rule, request.precision, request.placement, request.folds
    device = input_device(adapter, request.execution)
    accumulators = {
        where: linear_statistics(group, adapter.hidden_size, device, where, rule, precision, folds)
        for where in ("fused", "separate")
        if (group := [cut for cut in cuts if selection.placement_of(cut, placement) == where])
    }
    with stage("capture", "capture (statistics)"):
        statistics = list(accumulators.values())
        run_capture(adapter, batches, statistics, desc="capture (statistics)", execution=request.execution)
    out = {}
    for where, accumulator in accumulators.items():
        if empty := [list(cut) for cut, s in accumulator.result().items() if s.n_tokens == 0]:
            raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cuts {empty}")
        out[where] = accumulator.result()
    return out


def keep_cut_statistics(
    captured: dict[str, dict[Cut, LinearStats]], request: SelectionRequest, cache: StatisticsCache
) -> None:
    """Store captured statistics in the cache, under the placement and token rule they were taken with."""
    rule, precision = request.rule, request.precision
    for where, stats in captured.items():
        for s in stats.values():
            if request.folds:
                cache.store(StoredFoldedStats.of(s, where, rule.key(), precision))
            else:
                cache.store(StoredLinearStats.of(s, where, rule.key(), precision))


def select_and_capture(
    request: SelectionRequest,
    adapter,
    calibration: TokenBatches,
    cache: StatisticsCache,
    needs_stats: bool,
    compute_missing: bool = True,
    extra_statistics=(),
    stats_batches: TokenBatches | None = None,
    stats_cache: StatisticsCache | None = None,
    search_steps: SearchSteps | None = None,
) -> Selection:
    """:func:`select`, then the chosen cuts' statistics (``needs_stats``): from the selection pass or
    the cache, else captured and kept (``compute_missing=False``: left out, for a later pass over the
    same data such as the token capture). ``stats_batches`` / ``stats_cache``: other data for the
    statistics than for the selection (the calibration set with masked copies) and their cache; the
    selection pass then gathers none, nor per fold."""
    stats_cache = cache if stats_cache is None else stats_cache
    with ExitStack() as held:  # jobs that need the same capture compute it once (StatisticsCache.capturing)
        caches = {id(c): c for c in (cache, stats_cache)}.values()
        for each in sorted(caches, key=lambda c: (str(c.root), c.model_hash, c.data_hash)):  # one order: no deadlock
            held.enter_context(each.capturing())
        return _select_and_capture(
            request, adapter, calibration, cache, needs_stats, compute_missing, extra_statistics, stats_batches,
            stats_cache, search_steps,
        )  # fmt: skip


def _select_and_capture(
    request, adapter, calibration, cache, needs_stats, compute_missing, extra_statistics, stats_batches,
    stats_cache, search_steps,
) -> Selection:  # fmt: skip
    separate_data = stats_batches is not None and stats_batches is not calibration
    stats_batches = calibration if stats_batches is None else stats_batches
    gather = needs_stats and not separate_data and not request.folds
    selection, gathered = select(request, adapter, calibration, cache, gather, extra_statistics, search_steps)
    if separate_data or request.folds:  # a selection pass's statistics (ls_residual) are of all plain data
        gathered = {}
    if not needs_stats or selection.block_states:
        return selection
    if request.cuts is None and request.metric.searches:
        fit_over_search(selection, request)
    found = cached_cut_statistics(selection, request, stats_cache, gathered)
    missing = [cut for cut in selection.cuts if cut not in found]
    if missing and compute_missing:
        captured = capture_cut_statistics(missing, selection, request, adapter, stats_batches)
        keep_cut_statistics(captured, request, stats_cache)
        found.update({cut: s for stats in captured.values() for cut, s in stats.items()})
    selection.stats = found
    return selection


def searched(request: SelectionRequest, adapter, calibration: TokenBatches, steps: SearchSteps) -> Selection:
    """The selection a search metric makes (SLEB, LaCo): it runs the model itself, in the
    selection, in capture stages (compression cost: :func:`search_stage`); nothing else is captured
    for it (its blocks are removed or merged, no transform is fitted). ``steps``: where a greedy
    search keeps and finds its finished steps."""
    metric, num_layers = request.metric, adapter.num_layers
    n_blocks = blocks_to_prune(request.n_prune, num_layers)
    if n_blocks > num_layers - 1:
        reason = f"the model has {num_layers} blocks; at most {num_layers - 1} can be removed"
        raise ConfigError("n_prune", request.n_prune, reason)
    context = SearchContext(adapter, calibration, n_blocks, request.settings, request.seed, steps)
    with nullcontext() if metric.stepwise else search_stage(metric.name):
        result = metric.search(context)
    result.check(num_layers)
    log.info("%s removes blocks %s", metric.name, sorted(result.removed))
    return Selection(result.cuts, None, {}, frozenset(), result.block_states, result.columns)


def cached_stats(cache: StatisticsCache, cut: Cut, placement: str, rule: TokenRule, precision: str, folds: int = 0):
    """The cached statistics of ``cut`` (per fold with ``folds``), or None."""
    if folds:
        return cache.read(StoredFoldedStats(cut, folds, placement, rule.key(), precision))
    return cache.read(StoredLinearStats(cut, placement, rule.key(), precision))


def stats_budget(request: SelectionRequest) -> float:
    """Bytes the LS statistics of one pass may take: ``capture.max_stats_gb`` when set, else the
    plan's measured budget, else 8 GiB."""
    if request.max_stats_gb is not None:
        return float(request.max_stats_gb) * GIB
    if request.execution is not None:
        return float(request.execution.stats_bytes)
    return DEFAULT_STATS_GB * GIB


def cut_stats_bytes(hidden: int) -> int:
    """One cut's LS statistics: ``M^T M`` and ``M^T R``, two d x d float64 matrices (candidates
    of one length have distinct starts, so each has its own ``M^T M`` whatever the token rule)."""
    return 2 * hidden * hidden * 8


def all_candidates_fit(request: SelectionRequest, hidden: int, n_candidates: int) -> bool:
    """Whether one pass may accumulate the statistics of every candidate cut within the budget
    (:func:`stats_budget`); ``capture.passes`` forces one or two. Logs the choice and why."""
    mode = request.passes
    need, budget = n_candidates * cut_stats_bytes(hidden), stats_budget(request)
    fits = mode == "one" or (mode == "auto" and need <= budget)
    why = f"capture.passes={mode}" if mode != "auto" else f"{gib(need)} {'within' if fits else 'over'} {gib(budget)}"
    log.info(
        "capture plan: %s (statistics of %d candidate cuts: %s)",
        "one pass" if fits else "two passes",
        n_candidates,
        why,
    )
    return fits


def candidate_groups(request: SelectionRequest, hidden: int, candidates: list) -> list[list]:
    """The candidates of an ``ls_residual`` selection split into groups whose statistics fit the
    budget, one capture pass each (all in one group with ``capture.passes=one``)."""
    per_cut, budget = cut_stats_bytes(hidden), stats_budget(request)
    size = len(candidates) if request.passes == "one" else max(1, min(len(candidates), int(budget // per_cut)))
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
