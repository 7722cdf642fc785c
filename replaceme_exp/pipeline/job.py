"""One job, stage by stage: plan -> load -> calibrate -> select -> estimate -> evaluate the unpruned
model -> prune -> heal -> evaluate the pruned model -> save.

:class:`PruningJob` is a recipe: one method per stage, each calling the stage's own code with typed
arguments and recording the columns of what it returns in the job's row (so a failure keeps what
was measured). What differs between a language model and a vision encoder is the job's
:class:`~replaceme_exp.pipeline.modality.Modality`.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import platform
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from replaceme_exp.capture import LayerDistances, TransformDistances, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import CaptureExecution, plan_execution
from replaceme_exp.capture.hooks import input_device
from replaceme_exp.errors import ConfigError, NonFiniteError, check_finite
from replaceme_exp.estimation.fitting import Fit, fit_transforms, label
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.evaluation.calibration_similarity import calibration_similarity_columns
from replaceme_exp.evaluation.heldout import heldout_distances, sequential_checks
from replaceme_exp.evaluation.speed import compare_speed, resident_bytes, room_for_a_copy
from replaceme_exp.healing import attach_trainable_transforms, fusion_weights, heal, healing_windows, teacher_targets
from replaceme_exp.models import adapter_for, count_parameters, load_model
from replaceme_exp.models.loading import LoadedModel, resolve_dtype
from replaceme_exp.pipeline.modality import MODALITIES, Calibration, JobPaths
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.selection.passes import Selection, linear_statistics, select_and_capture
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

# Cache entry kinds -> the stage names a row lists in ``cached_stages``.
CACHED_STAGE_NAMES = {
    "distances": "selection",
    "linear": "statistics",
    "linear_folds": "statistics",
    "layer_distances": "layer_distances",
    "ppl_heldout": "baseline_ppl",
    "harness": "baseline_harness",
    "dist_before": "dist_before",
    "similarity": "calibration_similarity",
    "channel_scales": "channel_scales",
}


class PruningJob:
    """A job of ``spec``, writing into ``row`` as it goes; :meth:`run` returns the row."""

    def __init__(self, spec: JobSpec, paths: JobPaths, row: dict):
        self.spec, self.config, self.paths, self.row = spec, spec.config, paths, row
        self.modality = MODALITIES.get(spec.modality)(spec, paths)
        self.sequential = False
        # activations from another copy of the model than the one pruned: 4-bit, or another dtype
        self.captures_on_copy = bool(spec.config.model.capture_4bit) or (
            spec.effective.capture_dtype != spec.config.model.dtype
        )

    def record(self, columns: dict) -> None:
        self.row.update(columns)

    def run(self) -> dict:
        torch.manual_seed(int(self.config.seed))
        if warning := self.row.get("regularizer_warning"):
            log.warning("%s", warning)
        self.plan()
        self.load()
        self.calibrate()
        self.select()
        self.estimate()
        self.load_evaluated_model()
        self.evaluate_unpruned()
        self.prune()
        self.heal()
        self.evaluate_pruned()
        self.measure_speed()
        self.save()
        return self.row

    def plan(self) -> None:
        """How the captures run (whole-model or layer-wise), from the model's size and free memory."""
        c = self.config
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(i)
        self.execution: CaptureExecution | None = None
        if c.model.capture_4bit:
            self.record({"capture_mode": "whole", "capture_plan": "whole-model capture: model.capture_4bit"})
            return
        seq_len = getattr(c.calibration, "seq_len", None)
        self.execution = plan_execution(
            c.capture, c.model, c.calibration.batch_size, seq_len, cache_dir=str(self.paths.cache_dir)
        )
        log.info("capture plan: %s", self.execution.reason)
        self.record({"capture_mode": self.execution.mode, "capture_plan": self.execution.reason})

    def load(self) -> None:
        """The model the captures run on (a 4-bit copy with ``model.capture_4bit``, a copy in
        ``model.capture_dtype``)."""
        c = self.config
        model_cfg = dataclasses.replace(c.model, dtype=self.spec.effective.capture_dtype)
        if self.execution is not None and self.execution.mode == "layerwise":  # the weights wait in host memory
            model_cfg = dataclasses.replace(model_cfg, device="cpu", device_map=None)
        with stage("load"):
            nf4 = bool(c.model.capture_4bit)
            self.captured = load_model(model_cfg, self.paths.cache_dir, self.spec.weights, nf4=nf4)
            self.capture_adapter = self.adapted(self.captured)
        # OLMo 2, Gemma 2/3, before any capture: a fused T, or an LS residual that ranks cuts by one
        # (its Y = L - M would be wrong where a norm follows the MLP)
        fused_ls = self.spec.requirements.fits_transform or self.spec.effective.selects_by_ls
        if fused_ls and self.spec.effective.lt_placement == "fused":
            self.capture_adapter.require_fusable()
        self.record({"model_revision": self.captured.identity.get("commit")})

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

    def calibrate(self) -> None:
        """The calibration batches and the statistics caches keyed by them."""
        c = self.config
        self.calibration: Calibration = self.modality.calibration(self.captured, self.capture_adapter)
        self.record(self.calibration.columns)
        root, model = c.capture.cache_dir, self.captured.identity_hash
        enabled, refresh = bool(c.capture.cache), bool(c.force)
        tokens = self.calibration.batches.content_hash()
        self.cache = StatisticsCache(root, model, tokens, enabled, refresh)
        self.search_steps = SearchSteps(
            Path(root) / "search_steps", model, tokens, bool(c.capture.search_steps), refresh
        )
        self.stats_cache = self.cache
        if self.spec.effective.padded_positions:  # padded positions' statistics depend on the batching
            content = self.calibration.estimation.layout_hash()
            self.stats_cache = StatisticsCache(root, model, content, enabled, refresh)
        elif self.calibration.estimation is not self.calibration.batches:
            content = self.calibration.estimation.content_hash()
            self.stats_cache = StatisticsCache(root, model, content, enabled, refresh)

    def select(self) -> None:
        """The cuts (selected, or as given), every candidate's distance and the chosen cuts' statistics;
        with ``record_calibration_similarity``, the cuts' CKA / CCA / PWCCA over the calibration tokens."""
        c, adapter = self.config, self.capture_adapter
        layer_matrix = self.cache.get_layer_distances() if c.record_layer_distances else None
        wanted = c.record_layer_distances and layer_matrix is None
        layer_distances = LayerDistances(adapter.num_layers) if wanted else None
        self.selection: Selection = select_and_capture(
            self.spec.selection_request(self.execution),
            adapter,
            self.calibration.batches,
            self.cache,
            self.spec.requirements.statistics,
            compute_missing=not self.spec.requirements.tokens,
            extra_statistics=[layer_distances] if layer_distances else [],
            stats_batches=self.calibration.estimation,
            stats_cache=self.stats_cache,
            search_steps=self.search_steps,
        )
        cuts, distances = self.selection.cuts, self.selection.distances
        self.record({"cuts": [list(cut) for cut in cuts], "num_lts": len(cuts), "n_prune": sum(e - s for s, e in cuts)})
        self.record(self.selection.columns)
        if distances is not None:
            check_finite("selection", "the candidate distances are", distances.values())
            chosen = [distances[cut] for cut in cuts if cut in distances]
            self.record(
                {
                    "candidate_distances": [[s, e, distances[(s, e)]] for s, e in sorted(distances)],
                    "selection_distance": float(min(chosen)) if chosen else None,
                }
            )
        if layer_distances is not None:
            if layer_distances.n_tokens == 0:  # no selection pass ran to carry it
                with stage("analysis"):
                    batches, desc = self.calibration.batches, "layer distances"
                    run_capture(adapter, batches, [layer_distances], desc=desc, execution=self.execution)
            layer_matrix = layer_distances.result()
            self.cache.put_layer_distances(layer_matrix)
        self.record({"layer_distances": layer_matrix})
        if c.record_calibration_similarity:
            with stage("analysis", "calibration similarity"):
                precision = self.spec.effective.capture_precision
                columns = calibration_similarity_columns(
                    adapter, self.calibration.batches, self.cache, cuts, precision, self.execution
                )
            self.record(columns)
        for cut, s in self.selection.stats.items():
            check_finite("capture", f"the statistics of cut {list(cut)} are", [s.mtm, s.mtr, s.r_sq])
        self.sequential = c.multi_lt == "sequential" and len(cuts) > 1

    def estimate(self) -> None:
        """Every transform from the unpruned model's activations (sequential cuts: in :meth:`prune`);
        a trained network that replaces the cut instead (:meth:`replace_cut`)."""
        self.estimator = self.spec.estimator()
        self.fit = Fit({})
        self.networks = {}
        if self.spec.requirements.replacement is not None:
            self.replace_cut()
        elif not self.sequential:
            self.fit = fit_transforms(
                self.capture_adapter,
                self.calibration.estimation,
                self.estimator,
                self.selection.cuts,
                self.selection.stats,
                dataclasses.replace(self.spec.fit_request(self.execution), composed=self.selection.composed),
                cache=self.stats_cache,
            )
            self.record(self.fit.columns())

    def replace_cut(self) -> None:
        """Train the network that replaces the selected cut (an estimator that declares a
        ``replacement``), then hand the surgery
        what it removes and adds: the adjusted cuts (the layer variant keeps the cut's first block),
        the retrained block's weights (``block_states``) and the FFN (``networks``, by the original
        index of the block it follows)."""
        (cut,) = self.selection.cuts
        store = self.config.store
        replacement = self.estimator.replace(
            self.capture_adapter,
            self.calibration.batches,
            cut,
            int(self.config.seed),
            store.location,
            store.directory,
            self.execution,
        )
        self.selection = dataclasses.replace(
            self.selection, cuts=replacement.cuts, block_states=replacement.block_states
        )
        self.networks = replacement.networks
        cuts = self.selection.cuts
        self.record({"cuts": [list(c) for c in cuts], "n_prune": sum(e - s for s, e in cuts)})
        self.record(replacement.columns)

    def load_evaluated_model(self) -> None:
        """The model that is evaluated and pruned: the captured one, or (``model.capture_4bit``,
        ``model.capture_dtype``) the model in ``model.dtype``, loaded once the copy is freed."""
        if self.captures_on_copy:
            del self.capture_adapter, self.captured
            gc.collect()
            torch.cuda.empty_cache()
            with stage("load"):
                self.loaded = load_model(self.config.model, self.paths.cache_dir, self.spec.weights)
                self.adapter = self.adapted(self.loaded)
        else:
            self.loaded, self.adapter = self.captured, self.capture_adapter
        # captures on the evaluated model run as planned when it is the captured one
        self.evaluated_execution = None if self.captures_on_copy else self.execution
        self.device = input_device(self.adapter, self.evaluated_execution)
        self.record(
            {
                "num_layers": self.adapter.num_layers,
                "device": device_name(self.device),
                "params_before": count_parameters(self.loaded.model),
            }
        )
        self.unpruned_bytes = resident_bytes(self.loaded.model)

    def evaluate_unpruned(self) -> None:
        """Held-out data and the unpruned model's scores (cached per model and evaluation)."""
        self.heldout = self.modality.heldout(self.loaded, self.adapter)
        self.baselines = BaselineCache(self.paths.baselines, refresh=bool(self.config.force))
        unpruned = self.modality.evaluate_unpruned(self.loaded, self.adapter, self.heldout, self.baselines, self.device)
        self.record(unpruned)

    def prune(self) -> None:
        """Each transform checked on held-out data, then the blocks removed and the transforms fused."""
        c = self.config
        self.take_teacher_targets()
        # lt_only trains T itself, against the fusion targets' unfused weights (copied before surgery)
        self.unfused = {}
        if c.healing.name == "lt_only" and c.lt_placement == "fused":
            self.unfused = fusion_weights(self.adapter, self.selection.cuts)
        if self.sequential:
            self.prune_sequentially()
        else:
            if self.heldout is not None and self.replaces_linearly:
                with stage("eval", "held-out distances"):
                    key = {
                        "model": self.loaded.identity_hash,
                        "windows": self.heldout.content_hash(),
                        "cuts": [list(cut) for cut in self.selection.cuts],
                    }
                    placement = {cut: self.selection.placement_of(cut, c.lt_placement) for cut in self.selection.cuts}
                    distances = heldout_distances(
                        self.adapter,
                        self.heldout,
                        self.fit.transforms,
                        self.baselines,
                        key,
                        placement if self.selection.composed else c.lt_placement,
                        self.spec.token_rule.massive_threshold,
                        self.evaluated_execution,
                    )
                self.record(distances.columns())
            with stage("surgery"):
                cuts, transforms, states = self.selection.cuts, self.fit.transforms, self.selection.block_states
                self.kept = prune(self.adapter, cuts, transforms, c.lt_placement, states, self.networks)
        caches = (self.cache, self.stats_cache, self.baselines)
        self.record({"cached_stages": sorted({CACHED_STAGE_NAMES.get(k, k) for cache in caches for k in cache.hits})})
        params_after = count_parameters(self.loaded.model) + replacement_parameters(self.loaded.model)
        self.record({"params_after": params_after, "kept_blocks": self.kept})
        self.record({"compression_ratio": 1.0 - params_after / self.row["params_before"]})
        self.record(self.modality.pruned_columns(self.row))
        self.record(self.modality.quality(self.loaded, self.heldout))

    @property
    def replaces_linearly(self) -> bool:
        """Whether each cut is replaced by its T alone (or nothing), the blocks before it unchanged,
        so the held-out distances between ``L_{start-1}`` and ``L_{end-1}`` describe the pruned model:
        not after a search that merged weights into kept blocks, nor for a cut from block 0 (no
        ``L_{-1}`` is captured), nor where a trained network replaces the cut."""
        linear = not self.selection.block_states and not self.networks
        return linear and all(start >= 1 for start, _ in self.selection.cuts)

    def prune_sequentially(self) -> None:
        """``multi_lt=sequential``: cuts in ascending order, each estimated on the model in which the
        earlier cuts are already applied (fused and removed), checked on held-out data in the same
        context, then applied itself."""
        c, adapter, request = self.config, self.adapter, self.spec.fit_request(self.evaluated_execution)
        checks, removed = [], 0
        for cut in self.selection.cuts:
            shifted = (cut[0] - removed, cut[1] - removed)
            stats = {}
            # the official code reloads the saved pruned model without a dtype: captures in float32
            with weights_in(self.loaded.model, self.spec.effective.capture_dtype):
                if self.estimator.needs_statistics and not self.estimator.needs_tokens:
                    if removed == 0 and cut in self.selection.stats:
                        stats = {shifted: self.selection.stats[cut]}
                    else:
                        stats = self.stage_statistics(shifted, cut)
                fit = fit_transforms(adapter, self.calibration.estimation, self.estimator, [shifted], stats, request)
            self.fit = self.fit.merged(fit.relabelled(shifted, cut))
            transform = fit.transforms[shifted]
            with stage("eval", "held-out distances"):
                check = TransformDistances({shifted: transform}, c.lt_placement, request.rule.massive_threshold)
                run_capture(adapter, self.heldout, [check], desc="held-out distances", execution=request.execution)
            checks.append(check)
            with stage("surgery"):
                prune(adapter, [shifted], {shifted: transform}, c.lt_placement)
            removed += cut[1] - cut[0]
        self.record(self.fit.columns())
        self.record(sequential_checks(checks).columns())
        self.kept = kept_blocks(self.row["num_layers"], self.selection.cuts)

    def stage_statistics(self, shifted, cut) -> dict:
        request = self.spec.fit_request(self.evaluated_execution)
        accumulator = linear_statistics(
            [shifted],
            self.adapter.hidden_size,
            input_device(self.adapter, request.execution),
            request.placement,
            request.rule,
            request.precision,
            self.spec.requirements.statistic_folds,
        )
        with stage("capture", f"capture (stage {list(cut)})"):
            desc = f"capture (stage {list(cut)})"
            run_capture(
                self.adapter, self.calibration.estimation, [accumulator], desc=desc, execution=request.execution
            )
        return accumulator.result()

    def take_teacher_targets(self) -> None:
        """``healing.loss=topk_kl``: the healing windows and the unpruned model's top-k next-token
        distribution on them, before surgery removes the blocks (the distillation's offline data)."""
        c = self.config
        self.healing_windows, self.targets = None, None
        if c.healing.name == "none" or c.healing.loss != "topk_kl":
            return
        with stage("data", "healing data"):
            self.healing_windows = healing_windows(c.healing, self.loaded.tokenizer)
        with stage("heal", "teacher top-k targets"):
            self.targets = teacher_targets(self.loaded.model, self.healing_windows, int(c.healing.kl_topk))
        self.record({"healing_teacher_gb": self.targets.nbytes / 2**30})

    def heal(self) -> None:
        """Fine-tune the pruned model (``healing``) and measure it again."""
        c = self.config
        if c.healing.name == "none":
            return
        for suffix in ("", "_ci_low", "_ci_high", "_window_nll"):
            self.row[f"ppl_heldout_before_healing{suffix}"] = self.row.pop(f"ppl_heldout{suffix}")
        windows = self.healing_windows
        if windows is None:
            with stage("data", "healing data"):
                windows = healing_windows(c.healing, self.loaded.tokenizer)
        self.record({"healing_windows": windows.n_sequences})
        trainable = None
        if c.healing.name == "lt_only":
            float32 = c.healing.master_weights == "float32"
            trainable = attach_trainable_transforms(
                self.adapter, self.fit.transforms, self.kept, self.unfused, c.lt_placement, float32
            )
        with stage("heal", f"healing ({c.healing.name})"):
            result = heal(self.adapter, windows, c.healing, trainable, self.targets)
        self.record(result.columns())
        self.record(self.modality.quality(self.loaded, self.heldout, healed=True))

    def evaluate_pruned(self) -> None:
        self.record(self.modality.evaluate_pruned(self.loaded, self.adapter, self.heldout, self.device))

    def measure_speed(self) -> None:
        """What pruning buys (``eval.speed``): the pruned model against a fresh copy of the unpruned one,
        loaded beside it on the job's device and measured alternately
        (:func:`~replaceme_exp.evaluation.speed.compare_speed`); not measured, and said in the row
        (``speed_skipped``), when that copy does not fit."""
        settings = self.config.eval.speed
        if not settings.enabled:
            return
        with stage("speed"):
            if (problem := room_for_a_copy(self.loaded.model, self.unpruned_bytes)) is not None:
                log.warning("speed not measured: %s", problem)
                self.record({"speed_skipped": problem})
                return
            unpruned = load_model(self.config.model, self.paths.cache_dir, self.spec.weights)
            try:
                comparison = compare_speed({"unpruned": unpruned.model, "pruned": self.loaded.model}, settings)
            finally:
                del unpruned
                gc.collect()
                torch.cuda.empty_cache()
        self.record(comparison.row())

    def save(self) -> None:
        """What ``save_model`` asks for (:attr:`JobSpec.model_save`): ``full``, the pruned model as a
        standard checkpoint under ``results_dir/models/<config_hash>``; ``transform``, each cut's T
        and the recipe that rebuilds that checkpoint from the base model (``make export``) under
        ``results_dir/transforms/``. With ``save_transforms``, the transforms file in either case."""
        saved = self.spec.model_save
        self.record({"saved_model": saved})
        if self.config.save_transforms or saved == "transform":
            self.save_transforms()
        if saved == "transform":
            self.save_recipe()
        if saved != "full":
            return
        if self.config.save_model == "transform":
            log.info("healing moved the weights beyond the transforms: saving the full checkpoint")
        with stage("save"):
            target = self.paths.model_dir(self.row["config_hash"])
            loaded = self.loaded
            save_checkpoint(loaded.model, loaded.tokenizer, target, self.checkpoint_metadata(), loaded.processor)
        self.record({"pruned_model_path": str(target)})

    def checkpoint_metadata(self) -> dict:
        """What a saved (or exported) checkpoint carries beside its weights (``replaceme.json``)."""
        keys = ("run_id", "config_hash", "model", "cuts", "objective", "alpha", "kept_blocks")
        return {k: self.row[k] for k in keys}

    def save_transforms(self) -> None:
        """One safetensors file: ``"<start>-<end>"`` (cuts of the unpruned model) -> T, float64,
        (hidden, hidden), as estimated (before any healing); cuts without a T (identity) are left out.
        New weights of kept blocks (a search's merges, a retrained block) go in as
        ``"block.<index>.<parameter>"``, a replacement FFN as ``"network.after_block.<index>.<parameter>"``
        (original indices), as computed."""
        fitted = self.fit.transforms.items()
        transforms = {label(cut): t.detach().double().cpu().contiguous() for cut, t in fitted if t is not None}
        transforms.update(block_state_tensors(self.selection.block_states))
        transforms.update(network_tensors(self.networks, NETWORK_PREFIX))
        target = self.paths.transforms_file(self.row["config_hash"])
        with stage("save", "save transforms"), atomic_path(target) as tmp:
            save_file(transforms, str(tmp), metadata={"run_id": self.row["run_id"], "model": self.row["model"]})
        self.record({"transforms_path": str(target)})

    def save_recipe(self) -> None:
        """Beside the transforms file, what rebuilds the pruned checkpoint from the base model: the
        job's configuration, the base weights' fingerprint, the cuts, how they were applied and each
        T's dtype as fitted (the file holds float64: cast back, the fused or attached T is the job's
        bit for bit). A few kB."""
        fitted = self.fit.transforms.items()
        recipe = {
            "config_hash": self.row["config_hash"],
            "config": dataclasses.asdict(self.config),
            "model_fingerprint": self.spec.weights,
            "cuts": [list(cut) for cut in self.selection.cuts],
            "sequential": self.sequential,
            "lt_placement": self.config.lt_placement,
            "block_states": sorted(self.selection.block_states),
            "networks": sorted(self.networks),
            "dtypes": {label(cut): str(t.dtype).removeprefix("torch.") for cut, t in fitted if t is not None},
            "metadata": self.checkpoint_metadata(),
        }
        with stage("save", "save recipe"):
            write_recipe(self.paths.transforms_file(self.row["config_hash"]), recipe)


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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
