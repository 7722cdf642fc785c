"""One job, stage by stage: plan -> load -> calibrate -> select -> estimate -> evaluate the unpruned
model -> prune -> heal -> evaluate the pruned model -> save.

:class:`PruningJob` is a recipe: one method per stage, each calling the stage's own code with the
results of earlier stages as arguments and returning its own
(:mod:`~replaceme_exp.pipeline.stage_results`); :meth:`PruningJob.run` hands them on and adds the
columns of each to the job's row as it arrives (so a failure keeps what was measured). What differs
between a language model and a vision encoder is the job's
:class:`~replaceme_exp.pipeline.modality.Modality`.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from replaceme_exp.capture import LayerDistances, TransformDistances, distributed, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import CaptureExecution, plan_execution
from replaceme_exp.capture.hooks import input_device
from replaceme_exp.capture.statistics import StoredLayerDistances
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.errors import ConfigError, NonFiniteError, check_finite
from replaceme_exp.estimation.estimators import Estimator
from replaceme_exp.estimation.fitting import Fit, fit_transforms, label
from replaceme_exp.evaluation.architecture import Machine, SpeedStore, architecture_signature, forward_flops_per_token
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.evaluation.calibration_similarity import calibration_similarity_columns
from replaceme_exp.evaluation.heldout import HeldoutDistances, heldout_distances, sequential_checks
from replaceme_exp.evaluation.speed import across_jobs, compare_speed, resident_bytes, room_for_a_copy
from replaceme_exp.healing import attach_trainable_transforms, fusion_weights, heal, healing_windows, teacher_targets
from replaceme_exp.models import adapter_for, count_parameters, load_model
from replaceme_exp.models.loading import LoadedModel, nf4_copy, resolve_dtype
from replaceme_exp.pipeline.modalities import MODALITIES
from replaceme_exp.pipeline.modality import JobPaths
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.pipeline.stage_results import (
    Baselines,
    Calibrated,
    CapturePlan,
    Distillation,
    Estimated,
    Evaluated,
    HealingData,
    Loaded,
    Pruned,
    SavedFile,
    Selected,
    removed_blocks,
)
from replaceme_exp.selection.passes import Selection, select_and_capture
from replaceme_exp.selection.search_steps import SearchSteps
from replaceme_exp.stages import stage
from replaceme_exp.storage import atomic_path
from replaceme_exp.surgery import (
    NETWORK_PREFIX,
    block_state_tensors,
    kept_blocks,
    network_tensors,
    prune,
    replacement_parameters,
    save_checkpoint,
    write_recipe,
)

log = logging.getLogger("replaceme_exp.job")

# Cache entry kinds -> the stage names a row lists in ``cached_stages`` (any other kind, a component's
# own accumulator: its kind).
CACHED_STAGE_NAMES = {
    "distances": "selection",
    "linear": "statistics",
    "linear_folds": "statistics",
    "layer_distances": "layer_distances",
    "ppl_heldout": "baseline_ppl",
    "harness": "baseline_harness",
    "dist_before": "dist_before",
    "similarity": "calibration_similarity",
}
# The pruned model's held-out quality columns, kept under ``ppl_heldout_before_healing*`` once it heals.
QUALITY_SUFFIXES = ("", "_ci_low", "_ci_high", "_window_nll")


class PruningJob:
    """A job of ``spec``; :meth:`run` fills its row."""

    def __init__(self, spec: JobSpec, paths: JobPaths):
        self.spec, self.config, self.paths = spec, spec.config, paths
        self.modality = MODALITIES.get(spec.modality)(spec, paths)
        # activations from another copy of the model than the one pruned: 4-bit, or another dtype
        self.captures_on_copy = bool(spec.config.model.capture_4bit) or (
            spec.effective.capture_dtype != spec.config.model.dtype
        )

    def run(self, row: dict) -> torch.device:
        """Every stage in turn, each given the results it needs; the columns of each result go into
        ``row`` as it arrives. Returns the device the evaluated model's inputs go to (where the job's
        peak memory is read). A rank other than 0 of a job of several processes
        (:mod:`~replaceme_exp.capture.distributed`) takes its share of the calibration captures and
        returns None after the last of them."""
        torch.manual_seed(int(self.config.seed))
        if warning := row.get("regularizer_warning"):
            log.warning("%s", warning)
        with distributed.sharing():  # several ranks: these stages' captures are split over them
            plan = recorded(row, self.plan())
            captured = recorded(row, self.load(plan))
            calibrated = recorded(row, self.calibrate(captured))
            selected = recorded(row, self.select(captured, calibrated))
            row.update(self.layer_distances(captured, calibrated, selected))
            row.update(self.calibration_similarity(captured, calibrated, selected))
            estimated = recorded(row, self.estimate(captured, calibrated, selected))
        if not distributed.is_leader():  # rank 0 alone goes on (and writes the row)
            return None
        reused = None if self.captures_on_copy else captured
        del captured  # a copy's memory is freed before the model in model.dtype loads
        evaluated = recorded(row, self.load_evaluated_model(reused))
        baselines = recorded(row, self.evaluate_unpruned(evaluated))
        distillation = recorded(row, self.take_teacher_targets(evaluated))
        row.update(self.check_transforms(evaluated, selected, estimated, baselines))
        pruned = recorded(row, self.prune(evaluated, calibrated, selected, estimated, baselines))
        row.update(self.modality.quality(evaluated.loaded, baselines.heldout))
        if self.config.healing.name != "none":
            for suffix in QUALITY_SUFFIXES:
                row[f"ppl_heldout_before_healing{suffix}"] = row.pop(f"ppl_heldout{suffix}")
            healing = recorded(row, self.healing_data(evaluated, distillation))
            row.update(self.heal(evaluated, pruned, healing))
            row.update(self.modality.quality(evaluated.loaded, baselines.heldout, healed=True))
        row.update(self.evaluate_pruned(evaluated, baselines))
        row.update(self.measure_speed(evaluated))
        row["saved_model"] = self.spec.model_save
        for saved in self.save(evaluated, selected, estimated, pruned, checkpoint_metadata(row)):
            recorded(row, saved)
        return evaluated.device

    def plan(self) -> CapturePlan:
        """How the captures run (whole-model or layer-wise), from the model's size and free memory."""
        c = self.config
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(i)
        ranks = distributed.ranks()
        split = (ranks.world_size, float(c.capture.timeout_s)) if ranks is not None else (1, None)
        if c.model.capture_4bit:
            execution = self.whole_model_plan("whole-model capture: model.capture_4bit")
            return CapturePlan(execution, "whole", execution.reason, *split)
        seq_len = getattr(c.calibration, "seq_len", None)
        execution = plan_execution(
            c.capture, c.model, c.calibration.batch_size, seq_len, cache_dir=str(self.paths.cache_dir)
        )
        log.info("capture plan: %s", execution.reason)
        if ranks is not None and execution.mode == "layerwise":
            world = ranks.world_size
            reason = f"the plan is layer-wise ({execution.reason}): {world} ranks each capture the whole model"
            raise ConfigError("capture.mode", c.capture.mode, reason)
        if ranks is not None:
            log.info("capture plan: calibration captures split over %d ranks, batches in blocks", ranks.world_size)
        return CapturePlan(execution, execution.mode, execution.reason, *split)

    def whole_model_plan(self, reason: str = "") -> CaptureExecution:
        """A whole-model capture plan with the default statistics budget (a 4-bit copy's captures,
        those on the model reloaded after a capture copy), the last block's state as configured."""
        return CaptureExecution(reason=reason, last_state=self.config.capture.last_state or "block_output")

    def load(self, plan: CapturePlan) -> Loaded:
        """The model the captures run on (a 4-bit copy with ``model.capture_4bit``, a copy in
        ``model.capture_dtype``), under the capture ``plan``."""
        c, execution = self.config, plan.execution
        model_cfg = dataclasses.replace(c.model, dtype=self.spec.effective.capture_dtype)
        if execution is not None and execution.mode == "layerwise":  # the weights wait in host memory
            model_cfg = dataclasses.replace(model_cfg, device="cpu", device_map=None)
        with stage("load"):
            loaded = load_model(model_cfg, self.paths.cache_dir, self.spec.weights, nf4=bool(c.model.capture_4bit))
            adapter = self.adapted(loaded)
        # OLMo 2, Gemma 2/3, before any capture: a fused T, or an LS residual that ranks cuts by one
        # (its Y = L - M would be wrong where a norm follows the MLP)
        fused_ls = self.spec.requirements.fits_transform or self.spec.effective.selects_by_ls
        if fused_ls and self.spec.effective.lt_placement == "fused":
            adapter.require_fusable()
        return Loaded(loaded, adapter, execution)

    @staticmethod
    def adapted(loaded: LoadedModel):
        """The model's adapter, once every weight is checked finite (NaN or inf fails the job at
        loading in one line naming the parameter: the checkpoint is broken, not the job)."""
        try:
            check_weights_finite(loaded.model)
        except NonFiniteError as err:
            reason = f"{err.what} not finite (NaN or inf): the checkpoint is broken"
            raise ConfigError("model", loaded.name, reason) from err
        return adapter_for(loaded.model)

    def calibrate(self, captured: Loaded) -> Calibrated:
        """The calibration batches and the statistics caches keyed by them."""
        c = self.config
        calibration = self.modality.calibration(captured.loaded, captured.adapter)
        root, model = c.capture.cache_dir, captured.loaded.identity_hash
        enabled, refresh, last_state = bool(c.capture.cache), bool(c.force), captured.execution.last_state
        tokens = calibration.batches.content_hash()
        cache = StatisticsCache(root, model, tokens, enabled, refresh, last_state)
        search_steps = SearchSteps(Path(root) / "search_steps", model, tokens, bool(c.capture.search_steps), refresh)
        stats_cache = cache
        if self.spec.effective.padded_positions:  # padded positions' statistics depend on the batching
            content = calibration.estimation.layout_hash()
            stats_cache = StatisticsCache(root, model, content, enabled, refresh, last_state)
        elif calibration.estimation is not calibration.batches:
            content = calibration.estimation.content_hash()
            stats_cache = StatisticsCache(root, model, content, enabled, refresh, last_state)
        batches, estimation = calibration.batches, calibration.estimation
        if distributed.shared() is not None:  # every rank must split the same batches
            distributed.same_on_every_rank(f"{tokens}/{estimation.layout_hash()}", "the calibration batches")
        return Calibrated(batches, estimation, cache, stats_cache, search_steps, calibration.columns)

    def select(self, captured: Loaded, calibrated: Calibrated) -> Selected:
        """The cuts (selected, or as given), every candidate's distance and the chosen cuts'
        statistics; with ``record_layer_distances``, the layer distance matrix from the cache, else
        riding the selection pass when one runs."""
        c, adapter = self.config, captured.adapter
        layer_matrix = calibrated.cache.read(StoredLayerDistances()) if c.record_layer_distances else None
        wanted = c.record_layer_distances and layer_matrix is None
        riding = LayerDistances(adapter.num_layers) if wanted else None
        selection = select_and_capture(
            self.spec.selection_request(captured.execution),
            adapter,
            calibrated.batches,
            calibrated.cache,
            self.spec.requirements.statistics,
            compute_missing=not self.spec.requirements.tokens,
            extra_statistics=[riding] if riding else [],
            stats_batches=calibrated.estimation,
            stats_cache=calibrated.stats_cache,
            search_steps=calibrated.search_steps,
        )
        if selection.distances is not None:
            check_finite("selection", "the candidate distances are", selection.distances.values())
        if riding is not None and riding.n_tokens > 0:
            layer_matrix = riding.result()
            calibrated.cache.store(StoredLayerDistances(layer_matrix))
        return Selected(selection, c.multi_lt == "sequential" and len(selection.cuts) > 1, layer_matrix)

    def layer_distances(self, captured: Loaded, calibrated: Calibrated, selected: Selected) -> dict:
        """``layer_distances``: with ``record_layer_distances``, the mean cosine distance between every
        two blocks' outputs, (num_layers, num_layers), as :meth:`select` found them, else from a pass
        of its own; None otherwise."""
        matrix = selected.layer_distances
        if self.config.record_layer_distances and matrix is None:  # no selection pass ran to carry it
            distances = LayerDistances(captured.adapter.num_layers)
            with stage("analysis"):
                batches, execution = calibrated.batches, captured.execution
                run_capture(captured.adapter, batches, [distances], desc="layer distances", execution=execution)
            matrix = distances.result()
            calibrated.cache.store(StoredLayerDistances(matrix))
        return {"layer_distances": matrix}

    def calibration_similarity(self, captured: Loaded, calibrated: Calibrated, selected: Selected) -> dict:
        """With ``record_calibration_similarity``, the selected cuts' CKA / CCA / PWCCA columns over
        the calibration tokens."""
        if not self.config.record_calibration_similarity:
            return {}
        with stage("analysis", "calibration similarity"):
            return calibration_similarity_columns(
                captured.adapter,
                calibrated.batches,
                calibrated.cache,
                selected.selection.cuts,
                self.spec.effective.capture_precision,
                captured.execution,
            )

    def estimate(self, captured: Loaded, calibrated: Calibrated, selected: Selected) -> Estimated:
        """Every transform from the unpruned model's activations (sequential cuts: in :meth:`prune`);
        a trained network that replaces the cut instead (:meth:`replace_cut`)."""
        selection = selected.selection
        for cut, s in selection.stats.items():
            check_finite("capture", f"the statistics of cut {list(cut)} are", [s.mtm, s.mtr, s.r_sq])
        estimator = self.spec.estimator()
        if self.spec.requirements.replacement is not None:
            return self.replace_cut(estimator, captured, calibrated, selection)
        if selected.sequential:
            return Estimated(estimator, Fit({}), selection)
        request = dataclasses.replace(self.spec.fit_request(captured.execution), composed=selection.composed)
        adapter, batches, cache = captured.adapter, calibrated.estimation, calibrated.stats_cache
        fit = fit_transforms(adapter, batches, estimator, selection.cuts, selection.stats, request, cache=cache)
        return Estimated(estimator, fit, selection, columns=fit.columns())

    def replace_cut(
        self, estimator: Estimator, captured: Loaded, calibrated: Calibrated, selection: Selection
    ) -> Estimated:
        """Train the network that replaces the selected cut (an estimator that declares a
        ``replacement``), then hand the surgery what it removes and adds: the adjusted cuts (the layer
        variant keeps the cut's first block), the retrained block's weights (``block_states``) and the
        FFN (``networks``, by the original index of the block it follows)."""
        (cut,) = selection.cuts
        store = self.config.store
        replacement = estimator.replace(
            captured.adapter,
            calibrated.batches,
            cut,
            int(self.config.seed),
            store.location,
            store.directory,
            captured.execution,
        )
        selection = dataclasses.replace(selection, cuts=replacement.cuts, block_states=replacement.block_states)
        cuts = selection.cuts
        columns = {"cuts": [list(c) for c in cuts], "n_prune": removed_blocks(cuts), **replacement.columns}
        return Estimated(estimator, Fit({}), selection, replacement.networks, columns)

    def load_evaluated_model(self, captured: Loaded | None) -> Evaluated:
        """The model that is evaluated and pruned: ``captured``, or (None: it was a copy in 4 bits or
        ``model.capture_dtype``, now freed) the model in ``model.dtype``."""
        if captured is None:
            gc.collect()
            torch.cuda.empty_cache()
            with stage("load"):
                loaded = load_model(self.config.model, self.paths.cache_dir, self.spec.weights)
                captured = Loaded(loaded, self.adapted(loaded), self.whole_model_plan())
        loaded, adapter, execution = captured.loaded, captured.adapter, captured.execution
        return Evaluated(
            loaded,
            adapter,
            execution,
            input_device(adapter, execution),
            adapter.num_layers,
            count_parameters(loaded.model),
            resident_bytes(loaded.model),
        )

    def evaluate_unpruned(self, evaluated: Evaluated) -> Baselines:
        """Held-out data and the unpruned model's scores (cached per model and evaluation)."""
        loaded, adapter = evaluated.loaded, evaluated.adapter
        heldout = self.modality.heldout(loaded, adapter)
        cache = BaselineCache(self.paths.baselines, refresh=bool(self.config.force))
        unpruned = self.modality.evaluate_unpruned(loaded, adapter, heldout, cache, evaluated.device)
        return Baselines(heldout, cache, unpruned)

    def take_teacher_targets(self, evaluated: Evaluated) -> Distillation:
        """``healing.loss=topk_kl``: the healing windows and the unpruned model's top-k next-token
        distribution on them, before surgery removes the blocks (the distillation's offline data)."""
        c = self.config
        if c.healing.name == "none" or c.healing.loss != "topk_kl":
            return Distillation()
        with stage("data", "healing data"):
            windows = healing_windows(c.healing, evaluated.loaded.tokenizer)
        with stage("heal", "teacher top-k targets"):
            targets = teacher_targets(evaluated.loaded.model, windows, int(c.healing.kl_topk))
        return Distillation(windows, targets)

    def check_transforms(
        self, evaluated: Evaluated, selected: Selected, estimated: Estimated, baselines: Baselines
    ) -> dict:
        """Each transform checked on held-out data before surgery (not sequential cuts: checked as
        they are pruned, nor a cut not replaced linearly); the held-out distance columns."""
        if selected.sequential or baselines.heldout is None or not estimated.replaces_linearly:
            return {}
        c, selection = self.config, estimated.selection
        with stage("eval", "held-out distances"):
            key = {
                "model": evaluated.loaded.identity_hash,
                "windows": baselines.heldout.content_hash(),
                "cuts": [list(cut) for cut in selection.cuts],
            }
            placement = {cut: selection.placement_of(cut, c.lt_placement) for cut in selection.cuts}
            distances = heldout_distances(
                evaluated.adapter,
                baselines.heldout,
                estimated.fit.transforms,
                baselines.cache,
                key,
                placement if selection.composed else c.lt_placement,
                self.spec.token_rule.massive_threshold,
                evaluated.execution,
            )
        return distances.columns()

    def prune(
        self,
        evaluated: Evaluated,
        calibrated: Calibrated,
        selected: Selected,
        estimated: Estimated,
        baselines: Baselines,
    ) -> Pruned:
        """The blocks removed and the transforms fused (sequential cuts: each estimated, checked and
        applied in turn, :meth:`prune_sequentially`)."""
        c, adapter, selection = self.config, evaluated.adapter, estimated.selection
        # lt_only trains T itself, against the fusion targets' unfused weights (copied before surgery)
        unfused = {}
        if c.healing.name == "lt_only" and c.lt_placement == "fused":
            unfused = fusion_weights(adapter, selection.cuts)
        fit, checks = estimated.fit, None
        if selected.sequential:
            fit, checks = self.prune_sequentially(evaluated, calibrated, estimated, baselines.heldout)
            kept = kept_blocks(evaluated.num_layers, selection.cuts)
        else:
            with stage("surgery"):
                placement, states, networks = c.lt_placement, selection.block_states, estimated.networks
                kept = prune(adapter, selection.cuts, fit.transforms, placement, states, networks)
        caches = (calibrated.cache, calibrated.stats_cache, baselines.cache)
        cached = sorted({CACHED_STAGE_NAMES.get(k, k) for cache in caches for k in cache.hits})
        model = evaluated.loaded.model
        params_after = count_parameters(model) + replacement_parameters(model)
        modality_columns = self.modality.pruned_columns(removed_blocks(selection.cuts), evaluated.num_layers)
        return Pruned(kept, fit, unfused, checks, cached, params_after, evaluated.params_before, modality_columns)

    def prune_sequentially(
        self, evaluated: Evaluated, calibrated: Calibrated, estimated: Estimated, heldout: TokenBatches
    ) -> tuple[Fit, HeldoutDistances]:
        """``multi_lt=sequential``: cuts in ascending order, each estimated on the model in which the
        earlier cuts are already applied (fused and removed), checked on held-out data in the same
        context, then applied itself. Returns the fit of every cut and their held-out checks."""
        c, adapter, request = self.config, evaluated.adapter, self.spec.fit_request(evaluated.execution)
        estimator, selection = estimated.estimator, estimated.selection
        fit, checks, removed = estimated.fit, [], 0
        for cut in selection.cuts:
            shifted = (cut[0] - removed, cut[1] - removed)
            # the official code reloads the saved pruned model without a dtype (captures in float32), or in
            # 4 bits with use_4bit (re-quantised for each cut); the fit captures the statistics it lacks
            by_statistics = request.needs.statistics and not request.needs.tokens
            known = by_statistics and removed == 0 and cut in selection.stats
            stats = {shifted: selection.stats[cut]} if known else {}
            with self.capture_copy(evaluated, first=removed == 0, captures=not known) as on:
                found = fit_transforms(on.adapter, calibrated.estimation, estimator, [shifted], stats, request)
            fit = fit.merged(found.relabelled(shifted, cut))
            transform = found.transforms[shifted]
            with stage("eval", "held-out distances"):
                check = TransformDistances({shifted: transform}, c.lt_placement, request.rule.massive_threshold)
                run_capture(adapter, heldout, [check], desc="held-out distances", execution=request.execution)
            checks.append(check)
            with stage("surgery"):
                prune(adapter, [shifted], {shifted: transform}, c.lt_placement)
            removed += cut[1] - cut[0]
        return fit, sequential_checks(checks)

    @contextmanager
    def capture_copy(self, evaluated: Evaluated, first: bool = False, captures: bool = True) -> Iterator[Evaluated]:
        """The partly pruned model a sequential cut is captured on: ``evaluated`` with its weights in
        ``model.capture_dtype`` for the capture, or with ``model.capture_4bit`` a 4-bit NF4 copy of it
        (:func:`~replaceme_exp.models.loading.nf4_copy`, as the official code reloads the saved pruned
        model with ``use_4bit``), made only where the cut ``captures`` (not where its statistics came
        from the selection's pass on the 4-bit copy of the unpruned model)."""
        if not self.config.model.capture_4bit:
            with weights_in(evaluated.loaded.model, self.spec.effective.capture_dtype):
                yield evaluated
            return
        if not captures:
            yield evaluated
            return
        with ExitStack() as copies:
            with stage("load", "4-bit copy" if first else "4-bit copy of the partly pruned model"):
                model = copies.enter_context(self.nf4_copy(evaluated.loaded.model))
            loaded = dataclasses.replace(evaluated.loaded, model=model)
            yield dataclasses.replace(evaluated, loaded=loaded, adapter=adapter_for(model))

    def nf4_copy(self, model):
        """:func:`~replaceme_exp.models.loading.nf4_copy` of ``model``, its unquantised parts in the
        protocol's dtype (``capture_dtype``: float16 under ``protocol=official``)."""
        return nf4_copy(model, self.spec.effective.capture_dtype, self.config.model.device_map)

    def healing_data(self, evaluated: Evaluated, distillation: Distillation) -> HealingData:
        """The healing windows (those the teacher's targets were taken on, with ``loss=topk_kl``)."""
        windows = distillation.windows
        if windows is None:
            with stage("data", "healing data"):
                windows = healing_windows(self.config.healing, evaluated.loaded.tokenizer)
        return HealingData(windows, distillation.targets)

    def heal(self, evaluated: Evaluated, pruned: Pruned, data: HealingData) -> dict:
        """Fine-tune the pruned model (``healing``); the healing run's columns."""
        c = self.config
        trainable = None
        if c.healing.name == "lt_only":
            float32 = c.healing.master_weights == "float32"
            trainable = attach_trainable_transforms(
                evaluated.adapter, pruned.fit.transforms, pruned.kept, pruned.unfused, c.lt_placement, float32
            )
        with stage("heal", f"healing ({c.healing.name})"):
            result = heal(evaluated.adapter, data.windows, c.healing, trainable, data.targets)
        return result.columns()

    def evaluate_pruned(self, evaluated: Evaluated, baselines: Baselines) -> dict:
        """The pruned (and healed) model's scores, as row columns; ``eval_quantisation``: nf4 where the
        official code scores a 4-bit copy of it (:attr:`~replaceme_exp.pipeline.spec.JobSpec.evaluates_in_4bit`)."""
        loaded, adapter, quantisation = evaluated.loaded, evaluated.adapter, None
        with ExitStack() as copies:
            if self.spec.evaluates_in_4bit:
                with stage("load", "4-bit copy of the pruned model"):
                    model = copies.enter_context(self.nf4_copy(loaded.model))
                loaded, adapter, quantisation = dataclasses.replace(loaded, model=model), adapter_for(model), "nf4"
            heldout, unpruned = baselines.heldout, baselines.unpruned
            scores = self.modality.evaluate_pruned(loaded, adapter, heldout, unpruned, evaluated.device)
        return {**scores, "eval_quantisation": quantisation}

    def measure_speed(self, evaluated: Evaluated) -> dict:
        """What pruning buys (``eval.speed``): the pruned model against a fresh copy of the unpruned one,
        loaded beside it on the job's device and measured alternately
        (:func:`~replaceme_exp.evaluation.speed.compare_speed`); not measured, and said in the row
        (``speed_skipped``), when that copy does not fit. Returns the row's speed columns."""
        settings = self.config.eval.speed
        if not settings.enabled:
            return {}
        model = evaluated.loaded.model
        with stage("speed"):
            if (problem := room_for_a_copy(model, evaluated.unpruned_bytes)) is not None:
                log.warning("speed not measured: %s", problem)
                return {"speed_skipped": problem}
            unpruned = load_model(self.config.model, self.paths.cache_dir, self.spec.weights)
            try:
                return self.speed_of_architecture(model, unpruned.model, settings)
            finally:
                del unpruned
                gc.collect()
                torch.cuda.empty_cache()

    def speed_of_architecture(self, model, unpruned, settings) -> dict:
        """The speed row of ``model``'s architecture against ``unpruned``'s on this machine: measured
        (:func:`~replaceme_exp.evaluation.speed.compare_speed`) while fewer than
        ``eval.speed.jobs_per_architecture`` jobs have measured it, else the figures of those that did
        (:func:`~replaceme_exp.evaluation.speed.across_jobs`); with the analytic FLOPs of both."""
        device = next(model.parameters()).device
        machine = Machine.here(device, next(model.parameters()).dtype)
        architecture = {
            "speed_architecture": architecture_signature(model),
            "speed_architecture_baseline": architecture_signature(unpruned),
        }
        key = {**architecture, "settings": dataclasses.asdict(settings), "machine": dataclasses.asdict(machine)}
        key["settings"].pop("jobs_per_architecture")
        key["settings"].pop("enabled")
        store = SpeedStore(Path(self.config.capture.cache_dir) / "speed")
        measured = store.measured(key) if settings.jobs_per_architecture else []
        flops = (
            forward_flops_per_token(model, settings.prompt_len),
            forward_flops_per_token(unpruned, settings.prompt_len),
        )
        analytic = {
            **architecture,
            "speed_processor": machine.processor,
            "flops_per_token": flops[0],
            "flops_per_token_baseline": flops[1],
            "flops_ratio": flops[0] / flops[1],
        }
        if settings.jobs_per_architecture and len(measured) >= settings.jobs_per_architecture:
            log.info("speed of this architecture measured by %d jobs on this machine: reused", len(measured))
            return {**across_jobs(measured), **analytic, "speed_reused": True, "speed_jobs": len(measured)}
        row = compare_speed({"unpruned": unpruned, "pruned": model}, settings).row()
        jobs = len(store.add(key, row)) if settings.jobs_per_architecture else 1
        return {**row, **analytic, "speed_reused": False, "speed_jobs": jobs}

    def save(
        self, evaluated: Evaluated, selected: Selected, estimated: Estimated, pruned: Pruned, metadata: dict
    ) -> Iterator[SavedFile]:
        """What ``save_model`` asks for (:attr:`JobSpec.model_save`): ``full``, the pruned model as a
        standard checkpoint under ``results_dir/models/<config_hash>``; ``transform``, each cut's T
        and the recipe that rebuilds that checkpoint from the base model (``make export``) under
        ``results_dir/transforms/``. With ``save_transforms``, the transforms file in either case.
        ``metadata``: what the checkpoint carries (:func:`checkpoint_metadata`). Yields each file
        as it is written (so a later failure keeps it in the row)."""
        saved = self.spec.model_save
        if self.config.save_transforms or saved == "transform":
            yield self.save_transforms(estimated, pruned, metadata)
        if saved == "transform":
            self.save_recipe(selected, estimated, pruned, metadata)
        if saved != "full":
            return
        if self.config.save_model == "transform":
            log.info("healing moved the weights beyond the transforms: saving the full checkpoint")
        with stage("save"):
            target = self.paths.model_dir(metadata["config_hash"])
            loaded = evaluated.loaded
            save_checkpoint(loaded.model, loaded.tokenizer, target, metadata, loaded.processor)
        yield SavedFile("pruned_model_path", target)

    def save_transforms(self, estimated: Estimated, pruned: Pruned, metadata: dict) -> SavedFile:
        """One safetensors file: ``"<start>-<end>"`` (cuts of the unpruned model) -> T, float64,
        (hidden, hidden), as estimated (before any healing); cuts without a T (identity) are left out.
        New weights of kept blocks (a search's merges, a retrained block) go in as
        ``"block.<index>.<parameter>"``, a replacement FFN as ``"network.after_block.<index>.<parameter>"``
        (original indices), as computed."""
        fitted = pruned.fit.transforms.items()
        transforms = {label(cut): t.detach().double().cpu().contiguous() for cut, t in fitted if t is not None}
        transforms.update(block_state_tensors(estimated.selection.block_states))
        transforms.update(network_tensors(estimated.networks, NETWORK_PREFIX))
        target = self.paths.transforms_file(metadata["config_hash"])
        with stage("save", "save transforms"), atomic_path(target) as tmp:
            save_file(transforms, str(tmp), metadata={"run_id": metadata["run_id"], "model": metadata["model"]})
        return SavedFile("transforms_path", target)

    def save_recipe(self, selected: Selected, estimated: Estimated, pruned: Pruned, metadata: dict) -> None:
        """Beside the transforms file, what rebuilds the pruned checkpoint from the base model: the
        job's configuration, the base weights' fingerprint, the cuts, how they were applied and each
        T's dtype as fitted (the file holds float64: cast back, the fused or attached T is the job's
        bit for bit). A few kB."""
        fitted, selection = pruned.fit.transforms.items(), estimated.selection
        recipe = {
            "config_hash": metadata["config_hash"],
            "config": dataclasses.asdict(self.config),
            "model_fingerprint": self.spec.weights,
            "cuts": [list(cut) for cut in selection.cuts],
            "sequential": selected.sequential,
            "lt_placement": self.config.lt_placement,
            "block_states": sorted(selection.block_states),
            "networks": sorted(estimated.networks),
            "dtypes": {label(cut): str(t.dtype).removeprefix("torch.") for cut, t in fitted if t is not None},
            "metadata": metadata,
        }
        with stage("save", "save recipe"):
            write_recipe(self.paths.transforms_file(metadata["config_hash"]), recipe)


def recorded(row: dict, result):
    """``result``, its columns added to ``row``."""
    row.update(result.columns)
    return result


def checkpoint_metadata(row: dict) -> dict:
    """What a saved (or exported) checkpoint carries beside its weights (``replaceme.json``): the
    row's identity, cuts and kept blocks."""
    keys = ("run_id", "config_hash", "model", "cuts", "objective", "alpha", "kept_blocks")
    return {k: row[k] for k in keys}


@contextmanager
def weights_in(model, dtype: str):
    """``model`` with its weights cast to ``dtype`` inside the block, back afterwards (lossless
    from a narrower dtype: bfloat16 -> float32 -> bfloat16 restores every weight)."""
    original, target = next(model.parameters()).dtype, resolve_dtype(dtype)
    if target == original:
        yield
        return
    model.to(target)
    try:
        yield
    finally:
        model.to(original)


def check_weights_finite(model) -> None:
    """One min/max reduction per tensor on one thread (NaN and inf propagate through it): many small
    parallel reductions stall on a busy CPU (0.3 s idle, up to 20 s with the other core loaded)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, parameter in model.named_parameters():
            if parameter.dtype.is_floating_point and parameter.numel():
                try:
                    low, high = torch.aminmax(parameter.detach())
                    finite = bool(torch.isfinite(low) & torch.isfinite(high))
                except RuntimeError:  # a dtype without aminmax (float8)
                    finite = bool(torch.isfinite(parameter.detach().float()).all())
                if not finite:
                    raise NonFiniteError("load", f"the weight {name} is")
    finally:
        torch.set_num_threads(threads)
