"""One job: data -> capture -> selection -> estimation -> surgery -> evaluation -> results row.

``run_recorded`` wraps a job so that it always writes a row (``finished``, or ``failed`` with its
error and the stage that failed; a skipped job returns its finished row), opens the job's W&B run
when the job starts, and a failed job does not stop a sweep (a stop signal does, after its row).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import functools
import gc
import hashlib
import json
import logging
import os
import platform
import resource
import signal
import subprocess
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch
from hydra.utils import instantiate, to_absolute_path
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.capture import LayerDistances, TransformDistances, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import capture_precision, plan_execution
from replaceme_exp.capture.runner import input_device
from replaceme_exp.capture.similarity import CCA_RIDGE, SimilarityStatistics
from replaceme_exp.capture.statistics import PLACEMENTS
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.data import build_calibration, heldout_windows
from replaceme_exp.data.augmentation import with_masked_copies
from replaceme_exp.data.calibration import Answerer
from replaceme_exp.errors import ConfigError, NonFiniteError, check_finite
from replaceme_exp.estimation.fitting import estimate, estimate_sequentially
from replaceme_exp.evaluation import perplexity
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.evaluation.harness import harness_settings, run_harness
from replaceme_exp.evaluation.samples import greedy_answers, side_by_side
from replaceme_exp.healing import attach_trainable_transforms, fusion_weights, heal, healing_windows
from replaceme_exp.models import adapter_for, count_parameters, load_model
from replaceme_exp.models.fingerprint import weights_fingerprint
from replaceme_exp.models.loading import check_nf4_capture, is_vision_config
from replaceme_exp.planning import capture_calibration, selection_metric_name
from replaceme_exp.progress import configure_from, progress_listener, quiet_library_bars
from replaceme_exp.results import ResultsStore, config_hash, setting_hash
from replaceme_exp.results.store import new_run_id
from replaceme_exp.surgery import kept_blocks, prune, recover_checkpoint, save_checkpoint
from replaceme_exp.tracking import StageEmissions, WandbRun
from replaceme_exp.tracking.emissions import job_gpu_ids
from replaceme_exp.validation import validate_config

log = logging.getLogger(__name__)


class Timer:
    """Wall time per stage (summed over repeats), logged under a name that says what runs
    (``baseline perplexity``, ``held-out distances``, ...), CodeCarbon's task per stage, and the
    W&B run's stage log. Row columns and energy are accounted per stage kind (``eval`` sums the
    evaluation passes); ``labelled`` holds the seconds per name."""

    def __init__(self, emissions: StageEmissions | None = None, on_stage=None):
        self.seconds: dict[str, float] = {}
        self.labelled: dict[str, float] = {}
        self.emissions = emissions or StageEmissions(enabled=False)
        self.on_stage = on_stage
        self.failed: str | None = None

    @contextmanager
    def __call__(self, stage: str, label: str | None = None):
        name = label or stage
        log.info("stage %s ...", name)
        start = time.perf_counter()
        try:
            with self.emissions.stage(stage):
                yield
        except BaseException:
            self.failed = self.failed or name  # the innermost stage that failed
            raise
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[stage] = self.seconds.get(stage, 0.0) + elapsed
            self.labelled[name] = self.labelled.get(name, 0.0) + elapsed
            log.info("stage %s done in %.1f s", name, elapsed)
            if self.on_stage is not None:
                self.on_stage(name, elapsed)


@functools.cache
def git_sha() -> str | None:
    """The commit of the code this process imported (read once, at import: a long sweep records the
    code it runs, not a commit made while it ran)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


git_sha()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def peak_memory_gb(device: torch.device) -> float:
    """Peak CUDA memory allocated, summed over the GPUs (``device_map=auto`` spreads a model);
    on a CPU the peak resident memory of the process."""
    if device.type == "cuda":
        return sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def effective_regularizer(cfg: DictConfig, estimator) -> str:
    """The regulariser a job really applies (``none`` when alpha is 0 or unused)."""
    name = cfg.regularizer.name
    alpha = float(cfg.alpha)
    if alpha < 0:
        raise ConfigError("alpha", cfg.alpha, "must be >= 0")
    if not estimator.uses_alpha:
        return "none"
    if name == "none" and alpha > 0:
        raise ConfigError("alpha", cfg.alpha, "has no effect with regularizer=none; use regularizer=l2 (ridge)")
    supported = ("none", "l1", "l2") if getattr(estimator, "needs_tokens", False) else ("none", "l2")
    if name not in supported:
        raise ConfigError("regularizer", name, f"objective={estimator.name} supports {', '.join(supported)}")
    return "none" if alpha == 0 else name


# Cache entry kinds -> the stage names a row lists in ``cached_stages``.
CACHED_STAGE_NAMES = {
    "distances": "selection",
    "linear": "statistics",
    "layer_distances": "layer_distances",
    "ppl_heldout": "baseline_ppl",
    "harness": "baseline_harness",
    "dist_before": "dist_before",
}


def cached_stages(*caches) -> list[str]:
    """The stages whose results came from a cache (``hits`` of the statistics and baseline caches)."""
    return sorted({CACHED_STAGE_NAMES.get(kind, kind) for cache in caches for kind in cache.hits})


def finite_baseline_perplexity(model, windows) -> float:
    """The unpruned model's held-out perplexity, refused (and so never cached) when not finite."""
    value = perplexity(model, windows)
    check_finite("eval", "the unpruned model's held-out perplexity is", [value])
    return value


def check_weights_finite(model) -> None:
    """NaN or inf in a weight fails the job at loading, naming the parameter."""
    for name, parameter in model.named_parameters():
        if parameter.dtype.is_floating_point and not bool(torch.isfinite(parameter).all()):
            raise NonFiniteError("load", f"the weight {name} is")


def library_versions(extra: tuple[str, ...] = ()) -> dict[str, str | None]:
    """Versions of the libraries whose code computes the numbers (recorded in every row), and of
    the ``extra`` packages a kind of job also depends on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "transformers", *extra):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def effective_method_columns(cfg: DictConfig, estimator) -> dict:
    """Row columns as they act, not as they were spelled (equivalent spellings share a config
    hash, so the row of the first must describe the others too): identity has no structure and
    fuses nothing; Adam is mini-batch whatever ``solver_schedule`` says; closed forms have no
    schedule."""
    columns = {"solver_schedule": None}
    if getattr(estimator, "needs_tokens", False):
        columns["solver_schedule"] = "minibatch" if estimator.solver == "adam" else estimator.schedule
    if not estimator.needs_statistics and not estimator.uses_alpha:  # identity
        columns.update(structure="generic")
        if cfg.cuts is not None or cfg.selection.metric != "ls_residual":
            columns.update(alpha=0.0, lt_placement="fused", plain_checkpoint=True)
    return columns


def token_rule_columns(rule: TokenRule, estimator, cfg: DictConfig) -> dict:
    """``estimation_tokens`` as it acts (``all`` when nothing is fitted from calibration tokens),
    ``estimation_first`` for skip_first, and the threshold of skip_massive and of the sink split."""
    fits = (
        estimator.needs_statistics
        or getattr(estimator, "needs_tokens", False)
        or (cfg.cuts is None and cfg.selection.metric == "ls_residual")
    )
    kind = rule.kind if fits else "all"
    return {
        "estimation_tokens": kind,
        "estimation_first": rule.first if kind == "skip_first" else None,
        "massive_threshold": float(rule.massive_threshold),
    }


def base_row(cfg: DictConfig, chash: str, sweep_id: str | None, shash: str | None = None) -> dict:
    return {
        "run_id": new_run_id(),
        "sweep_id": sweep_id,
        "config_hash": chash,
        "setting_hash": shash,
        "status": "running",
        "error": None,
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "git_sha": git_sha(),
        "model": cfg.model.name,
        "dtype": str(cfg.model.dtype),
        "calibration": cfg.calibration.name,
        "n_calib_samples": cfg.calibration.n_samples,
        "calib_seq_len": cfg.calibration.get("seq_len"),
        "objective": cfg.objective.name,
        "solver": None,  # closed form; numerical solvers come with the numerical objectives
        "structure": cfg.structure.name,
        "mask_ratio": float(cfg.mask_ratio),
        "mask_passes": int(cfg.get("mask_passes", 1)) if float(cfg.mask_ratio) else None,
        "capture_4bit": bool(cfg.model.get("capture_4bit", False)),
        "calibration_order": cfg.calibration.get("order"),
        "calibration_chat_turns": cfg.calibration.get("chat_turns"),
        "cached_stages": [],
        **{f"{package}_version": v for package, v in library_versions().items()},
        "lt_placement": cfg.lt_placement,
        "healing": cfg.healing.name,
        # every healing setting (lr, steps, batch, context, data, LoRA rank, ...) as the job ran it
        "healing_settings": OmegaConf.to_container(cfg.healing, resolve=True) if cfg.healing.name != "none" else None,
        "healing_data": cfg.healing.data.name if cfg.healing.name != "none" else None,
        "multi_lt": cfg.multi_lt,
        "plain_checkpoint": cfg.lt_placement == "fused",
        "regularizer": cfg.regularizer.name,
        "alpha": float(cfg.alpha),
        "seed": cfg.seed,
        "num_lts": cfg.num_lts,
        "n_prune": cfg.n_prune,
        "merge_consecutive": bool(cfg.merge_consecutive),
        "selection_metric": None,
        "selection_distance": None,
        "candidate_distances": None,  # [[start, end, distance], ...] over all candidates
        "layer_distances": None,  # (num_layers, num_layers) mean cosine distances, with record_layer_distances
        "eval": cfg.eval.name,
        "pruned_model_path": None,
    }


def heldout_distances(
    adapter,
    windows,
    transforms,
    baselines: BaselineCache,
    key: dict,
    placement: str = "fused",
    sink_threshold: float = 20.0,
) -> tuple[float, float, float, dict]:
    """(cos_dist_before, cos_dist_after, l2_dist_before, columns: sink/rest split, CKA, CCA) on held-out
    windows. The distances without T depend only on model, text, cuts and the sink threshold and
    are cached; jobs without any transform need no pass."""
    key = {**key, "metric": "dist_before", "sink_threshold": float(sink_threshold), "sink_median": "sequence"}
    key["similarity"] = ["linear_cka", f"mean_cca/ridge={CCA_RIDGE}"]
    if all(t is None for t in transforms.values()):
        before, l2, splits = baselines.get_or_compute(
            key, lambda: _no_transform_distances(adapter, windows, transforms, sink_threshold)
        )
        return before, before, l2, splits
    before, after, l2, splits = heldout_distances_pass(adapter, windows, transforms, placement, sink_threshold)
    unchanged = {k: v for k, v in splits.items() if "_after_" not in k}
    baselines.put(key, [before, l2, {**unchanged, **_after_is_before(unchanged)}])
    return before, after, l2, splits


def _after_is_before(splits: dict) -> dict:
    return {k.replace("_before_", "_after_"): v for k, v in splits.items() if "_before_" in k}


def _no_transform_distances(adapter, windows, transforms, sink_threshold) -> list:
    before, _, l2, splits = heldout_distances_pass(adapter, windows, transforms, "fused", sink_threshold)
    return [before, l2, splits]


def heldout_distances_pass(
    adapter, windows, transforms, placement: str = "fused", sink_threshold: float = 20.0
) -> tuple[float, float, float, dict]:
    """One pass over the held-out windows: (cos_dist_before, cos_dist_after, l2_dist_before,
    columns), the columns holding the sink/rest split and ``linear_cka_before`` /
    ``mean_cca_before`` (similarity of ``L_{start-1}`` and ``L_{end-1}``, mean over the cuts)."""
    check = TransformDistances(transforms, placement, sink_threshold)
    similarity = SimilarityStatistics(list(transforms), adapter.hidden_size, input_device(adapter))
    run_capture(adapter, windows, [check, similarity], desc="held-out distances")
    columns = check.split_result()
    for metric, column in (("cka", "linear_cka_before"), ("cca", "mean_cca_before")):
        values = similarity.result(metric).values()
        columns[column] = sum(values) / len(values)
    return (*check.result(), check.l2_result(), columns)


def run_job(cfg: DictConfig, row: dict, job_dir: str | os.PathLike, on_stage=None) -> dict:
    """Prune and evaluate; fills ``row`` as it goes (so a failure keeps what was measured, and
    ``failed_stage`` names the stage that failed), with the energy and emissions of each stage
    measured so far. ``on_stage(name, seconds)`` hears of each finished stage."""
    tracking = cfg.tracking.codecarbon
    gpu_ids = job_gpu_ids(
        cfg.model.get("device"), cfg.model.get("device_map"), torch.cuda.is_available(), torch.cuda.device_count()
    )
    row["codecarbon_gpu_ids"] = gpu_ids
    emissions = StageEmissions(tracking.enabled, tracking.country_iso_code, Path(job_dir) / "codecarbon", gpu_ids)
    timer = Timer(emissions, on_stage)
    try:
        if is_vision_config(cfg.model):
            from replaceme_exp.vision_job import prune_and_evaluate_vision

            return prune_and_evaluate_vision(cfg, row, timer)
        return prune_and_evaluate(cfg, row, timer)
    except BaseException:
        row["failed_stage"] = timer.failed
        raise
    finally:
        row.update(emissions.columns())
        emissions.close()


def job_work_dir(cfg: DictConfig, row: dict) -> Path:
    return Path(row.get("job_dir") or Path(to_absolute_path(cfg.results_dir)) / "jobs" / row["run_id"])


def prune_and_evaluate(cfg: DictConfig, row: dict, timer: Timer) -> dict:
    """data -> capture -> selection -> estimation -> surgery -> evaluation, stage by stage."""
    torch.manual_seed(int(cfg.seed))
    if cfg.lt_placement not in PLACEMENTS:
        raise ConfigError("lt_placement", cfg.lt_placement, f"choose one of {PLACEMENTS}")
    if cfg.multi_lt not in ("independent", "sequential"):
        raise ConfigError("multi_lt", cfg.multi_lt, "choose independent or sequential")
    check_nf4_capture(cfg.model)
    nf4 = bool(cfg.model.get("capture_4bit", False))
    if (
        nf4
        and cfg.multi_lt == "sequential"
        and (len(cfg.cuts) > 1 if OmegaConf.is_list(cfg.cuts) else cfg.cuts is None and cfg.num_lts != 1)
    ):
        raise ConfigError(
            "model.capture_4bit", True, "not with multi_lt=sequential and several cuts (the 4-bit copy is not pruned)"
        )
    mask_ratio = float(cfg.mask_ratio)
    cache_dir = to_absolute_path(cfg.cache_dir)
    results_dir = to_absolute_path(cfg.results_dir)
    force = bool(cfg.force)
    estimator = instantiate(cfg.objective)
    healing = cfg.healing.name
    if healing == "lt_only" and not estimator.fits_transform:
        reason = f"trains the linear transform; objective={estimator.name} fits none (heal with lora or full_model)"
        raise ConfigError("healing", healing, reason)
    token_rule = TokenRule.from_config(cfg.get("estimation"))
    row.update(token_rule_columns(token_rule, estimator, cfg))
    row["regularizer"] = effective_regularizer(cfg, estimator)
    row["alpha_scale"] = estimator.alpha_scale if estimator.uses_alpha else None
    row.update(effective_method_columns(cfg, estimator))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)

    execution = plan_execution(cfg, cache_dir=cache_dir) if not nf4 else None
    if execution is not None:
        log.info("capture plan: %s", execution.reason)
    row.update(
        capture_mode=execution.mode if execution else "whole",
        capture_precision=capture_precision(cfg),
        capture_plan=execution.reason if execution else "whole-model capture: model.capture_4bit",
    )
    model_cfg = cfg.model
    if execution is not None and execution.mode == "layerwise":  # the weights wait in host memory
        model_cfg = OmegaConf.merge(cfg.model, {"device": "cpu", "device_map": None})
    with timer("load"):
        # With model.capture_4bit (the official use_4bit) capture and estimation run on a 4-bit NF4
        # copy, loaded first and freed before the full model is loaded for baselines, surgery and eval.
        capture_loaded = load_model(model_cfg, cache_dir, row.get("model_fingerprint"), nf4=nf4)
    tokenizer = capture_loaded.tokenizer
    check_weights_finite(capture_loaded.model)
    capture_adapter = adapter_for(capture_loaded.model)
    capture_adapter.execution = execution
    if estimator.fits_transform and cfg.lt_placement == "fused":
        capture_adapter.require_fusable()  # OLMo 2, Gemma 2/3: before any capture
    row["model_revision"] = capture_loaded.identity.get("commit")

    with timer("data"):
        answerer = Answerer(capture_loaded.model, capture_loaded.identity_hash, cache_dir)
        calibration = build_calibration(cfg.calibration, tokenizer, answerer)
        # Masking is augmentation of the estimation data: the plain sequences plus masked copies.
        estimation_data = (
            with_masked_copies(calibration, mask_ratio, cfg.get("mask_passes", 1), int(cfg.seed))
            if mask_ratio
            else calibration
        )
    row["n_calib_tokens"] = calibration.n_tokens
    row["n_estimation_tokens"] = estimation_data.n_tokens
    enabled = bool(cfg.capture.cache)
    cache_root = to_absolute_path(cfg.capture.cache_dir)
    cache = StatisticsCache(cache_root, capture_loaded.identity_hash, calibration.content_hash(), enabled, force)
    stats_cache = (
        StatisticsCache(cache_root, capture_loaded.identity_hash, estimation_data.content_hash(), enabled, force)
        if estimation_data is not calibration
        else cache
    )
    if cfg.cuts is None:
        row["selection_metric"] = selection_metric_name(cfg.selection)
    needs_tokens = getattr(estimator, "needs_tokens", False)
    layer_matrix = cache.get_layer_distances() if cfg.record_layer_distances else None
    layer_distances = (
        LayerDistances(capture_adapter.num_layers) if cfg.record_layer_distances and layer_matrix is None else None
    )
    cuts, distances, stats = capture_calibration(
        cfg,
        capture_adapter,
        calibration,
        cache,
        estimator.needs_statistics,
        timer,
        compute_missing=not needs_tokens,
        extra_statistics=[layer_distances] if layer_distances else [],
        stats_batches=estimation_data,
        stats_cache=stats_cache,
    )
    row.update(cuts=[list(c) for c in cuts], num_lts=len(cuts), n_prune=sum(e - s for s, e in cuts))
    if distances is not None:
        check_finite("selection", "the candidate distances are", distances.values())
        row["candidate_distances"] = [[s, e, distances[(s, e)]] for s, e in sorted(distances)]
        chosen = [distances[c] for c in cuts if c in distances]
        row["selection_distance"] = float(min(chosen)) if chosen else None
    if layer_distances is not None:
        if layer_distances.n_tokens == 0:  # no selection pass ran to carry it
            with timer("analysis"):
                run_capture(capture_adapter, calibration, [layer_distances], desc="layer distances")
        layer_matrix = layer_distances.result()
        cache.put_layer_distances(layer_matrix)
    row["layer_distances"] = layer_matrix

    for cut, s in stats.items():
        check_finite("capture", f"the statistics of cut {list(cut)} are", [s.mtm, s.mtr, s.r_sq])
    sequential = cfg.multi_lt == "sequential" and len(cuts) > 1
    if not sequential:
        transforms = estimate(cfg, capture_adapter, estimation_data, estimator, cuts, stats, row, timer)
    if nf4:
        del capture_adapter, capture_loaded
        gc.collect()
        torch.cuda.empty_cache()
        with timer("load"):
            loaded = load_model(cfg.model, cache_dir, row.get("model_fingerprint"))
        check_weights_finite(loaded.model)
        adapter = adapter_for(loaded.model)
    else:
        loaded, adapter = capture_loaded, capture_adapter
    model = loaded.model
    # lt_only trains T itself, against the fusion targets' unfused weights (copied before surgery)
    unfused = fusion_weights(adapter, cuts) if healing == "lt_only" and cfg.lt_placement == "fused" else {}
    device = input_device(adapter)
    row.update(num_layers=adapter.num_layers, device=device_name(device), params_before=count_parameters(model))
    windows = heldout_windows(cfg.eval, tokenizer)
    baselines = BaselineCache(Path(results_dir) / "baselines", refresh=force)
    heldout_key = {"model": loaded.identity_hash, "windows": windows.content_hash()}
    harness = cfg.eval.get("harness")
    with timer("eval", "baseline perplexity"):
        row["ppl_heldout_baseline"] = baselines.get_or_compute(
            {**heldout_key, "metric": "ppl_heldout"}, lambda: finite_baseline_perplexity(model, windows)
        )
    if harness:
        with timer("eval", "baseline lm-eval"):
            settings = harness_settings(harness, int(cfg.seed))
            row.update(settings)
            harness_key = {
                "model": loaded.identity_hash,
                "metric": "harness",
                "harness": OmegaConf.to_container(harness, resolve=True),
                "settings": settings,
                "libraries": library_versions(),
            }
            baseline_scores = baselines.get_or_compute(
                harness_key, lambda: run_harness(model, tokenizer, harness, job_work_dir(cfg, row), int(cfg.seed))
            )
            check_finite("eval", "the unpruned model's avg_acc is", [baseline_scores["avg_acc"]])
            row["avg_acc_baseline"] = baseline_scores["avg_acc"]
            row.update({f"baseline_{name}": value for name, value in baseline_scores.items()})
    samples = cfg.eval.get("samples")
    if samples:
        with timer("eval", "generation samples (unpruned)"):
            unpruned_answers = greedy_answers(model, tokenizer, list(samples.prompts), samples.max_new_tokens)
    num_layers = adapter.num_layers
    if sequential:
        transforms, distances_before_after, splits = estimate_sequentially(
            cfg, adapter, estimation_data, windows, estimator, cuts, stats, row, timer
        )
        row["cos_dist_before"], row["cos_dist_after"] = distances_before_after
        row.update(splits)
        kept = kept_blocks(num_layers, cuts)
    else:
        with timer("eval", "held-out distances"):
            row["cos_dist_before"], row["cos_dist_after"], row["l2_dist_before"], splits = heldout_distances(
                adapter,
                windows,
                transforms,
                baselines,
                {**heldout_key, "cuts": [list(c) for c in cuts]},
                cfg.lt_placement,
                token_rule.massive_threshold,
            )
        row.update(splits)
        with timer("surgery"):
            kept = prune(adapter, cuts, transforms, cfg.lt_placement)
    check_finite("eval", "the held-out distances are", [row["cos_dist_before"], row["cos_dist_after"]])
    row["cached_stages"] = cached_stages(cache, stats_cache, baselines)
    row.update(params_after=count_parameters(model), kept_blocks=kept)
    row["compression_ratio"] = 1.0 - row["params_after"] / row["params_before"]

    with timer("eval", "pruned perplexity"):
        row["ppl_heldout"] = perplexity(model, windows)
        check_finite("eval", "the pruned model's held-out perplexity is", [row["ppl_heldout"]])
    if healing != "none":
        row["ppl_heldout_before_healing"] = row.pop("ppl_heldout")
        with timer("data", "healing data"):
            healing_data = healing_windows(cfg.healing, tokenizer)
        row["healing_windows"] = healing_data.n_sequences
        trainable = (
            attach_trainable_transforms(adapter, transforms, kept, unfused, cfg.lt_placement)
            if healing == "lt_only"
            else None
        )
        with timer("heal", f"healing ({healing})"):
            result = heal(adapter, healing_data, cfg.healing, trainable)
        row.update(result.columns())
        with timer("eval", "healed perplexity"):
            row["ppl_heldout"] = perplexity(model, windows)
            check_finite("eval", "the healed model's held-out perplexity is", [row["ppl_heldout"]])
    if harness:
        with timer("eval", "pruned lm-eval"):
            row.update(run_harness(model, tokenizer, harness, job_work_dir(cfg, row), int(cfg.seed)))
            check_finite("eval", "the pruned model's avg_acc is", [row["avg_acc"]])
            row["rp"] = row["avg_acc"] / row["avg_acc_baseline"]
    if samples:
        with timer("eval", "generation samples (pruned)"):
            pruned_answers = greedy_answers(model, tokenizer, list(samples.prompts), samples.max_new_tokens)
        row["generation_samples"] = side_by_side(list(samples.prompts), unpruned_answers, pruned_answers)

    if cfg.save_model:
        with timer("save"):
            target = Path(results_dir) / "models" / f"{row['config_hash']}"
            save_checkpoint(
                model,
                tokenizer,
                target,
                {k: row[k] for k in ("run_id", "config_hash", "model", "cuts", "objective", "alpha", "kept_blocks")},
            )
            row["pruned_model_path"] = str(target)
    return finish_row(row, timer, device, healed=healing != "none")


def finish_row(row: dict, timer: Timer, device: torch.device, healed: bool = False) -> dict:
    """``row`` marked finished, with each stage's seconds and the peak memory."""
    row["stage_seconds"] = dict(timer.labelled)
    row.update(
        time_capture_s=timer.seconds.get("capture", 0.0),
        time_estimate_s=timer.seconds.get("estimate", 0.0),
        time_eval_s=timer.seconds.get("eval", 0.0),
        time_heal_s=timer.seconds.get("heal") if healed else None,
        peak_mem_gb=peak_memory_gb(device),
        status="finished",
    )
    return row


@contextmanager
def config_lock(results_dir: str | os.PathLike, chash: str):
    """One job per config hash at a time (``results_dir/locks/<config_hash>.lock``, an exclusive
    ``flock``): a second identical job waits, then finds the first one's finished row and skips."""
    directory = Path(results_dir) / "locks"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{chash}.lock", "a+") as handle:
        locked = True
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("an identical job (config_hash=%s) is running; waiting for it", chash)
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as err:  # a filesystem without flock (Lustre noflock, some NFS/FUSE mounts)
            log.warning("no lock on %s (%s): identical jobs started at once may both run", directory, err)
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


def invalid_row(cfg: DictConfig, err: Exception, sweep_id: str | None) -> dict:
    """The failed row of a configuration refused before it ran (its config hash from the raw
    config, since its effective settings cannot be derived)."""
    try:
        raw = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # noqa: BLE001
        raw = str(cfg)
    chash = "invalid-" + hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {
        "run_id": new_run_id(),
        "sweep_id": sweep_id,
        "config_hash": chash,
        "status": "failed",
        "error": f"{type(err).__name__}: {err}",
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "git_sha": git_sha(),
        "model": OmegaConf.select(cfg, "model.name", default=None, throw_on_resolution_failure=False),
        "objective": OmegaConf.select(cfg, "objective.name", default=None, throw_on_resolution_failure=False),
    }


def run_recorded(
    cfg: DictConfig,
    sweep_id: str | None = None,
    raise_on_failure: bool = True,
    job_dir: str | os.PathLike | None = None,
    run_name: str | None = None,
    sweep_name: str | None = None,
) -> dict:
    """Run one job unless its config hash already has a finished row (and ``force`` is off),
    and always leave a row behind. The configuration is validated first (no model is loaded for a
    bad value: the failed row names key, value and reason); identical jobs run one at a time.
    Everything the job writes besides its row and model goes to ``job_dir`` (the Hydra job
    directory; default ``results_dir/jobs/<run_id>``): the W&B run and CodeCarbon's files. Returns
    the row (the existing one when skipped)."""
    try:
        validate_config(cfg)
    except ConfigError as err:
        row = invalid_row(cfg, err, sweep_id)
        row["failed_stage"] = "validation"  # the error is the job summary's line (run.py): not logged twice
        try:
            row["row_path"] = str(ResultsStore(to_absolute_path(cfg.results_dir)).write(row))
        except Exception as write_err:  # noqa: BLE001 - results_dir itself may be the bad value
            log.error("no row written: %s", write_err)
        if raise_on_failure:
            raise
        return row
    results_dir = to_absolute_path(cfg.results_dir)
    store = ResultsStore(results_dir)
    try:
        weights = weights_fingerprint(cfg.model, to_absolute_path(cfg.cache_dir))
    except Exception as err:  # noqa: BLE001 - e.g. the embedded model is missing: loading fails with a clear error
        log.warning("model fingerprint unavailable: %s", err)
        weights = None
    chash = config_hash(cfg, weights)
    with config_lock(results_dir, chash):
        model_dir = Path(results_dir) / "models" / chash
        recover_checkpoint(model_dir)
        if removed := TokenStore.remove_leftovers(chash, cfg.store.get("directory")):
            log.info("removed %d token store(s) a killed run of this configuration left", removed)
        done = store.finished_row(chash) if not cfg.force else None
        if done is not None and cfg.save_model and not model_dir.is_dir():
            log.warning("finished run %s lost its model %s: running again", done["run_id"], model_dir)
            done = None
        if done is not None:
            log.info("skipping: a finished row exists for config_hash=%s", chash)
            done["status"] = "skipped"
            done["row_path"] = str(row_path(store, done))
            return done
        return _run_and_record(cfg, store, chash, weights, sweep_id, raise_on_failure, job_dir, run_name, sweep_name)


class JobInterrupted(Exception):
    """The job's process was asked to stop (SIGTERM from a scheduler, SIGINT): the job becomes a
    failed row and a failed W&B run, then the process stops."""


@contextmanager
def stop_signals_raise():
    """While a job runs, SIGTERM and SIGINT raise :class:`JobInterrupted` in it (main thread only;
    the previous handlers come back afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise JobInterrupted(f"stopped by {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def row_path(store: ResultsStore, row: dict) -> Path:
    return store.runs / row["config_hash"] / f"{row['run_id']}.parquet"


def _run_and_record(cfg, store, chash, weights, sweep_id, raise_on_failure, job_dir, run_name, sweep_name) -> dict:
    configure_from(cfg.get("progress"))
    quiet_library_bars()
    row = base_row(cfg, chash, sweep_id, setting_hash(cfg, weights))
    row.update(model_fingerprint=weights, sweep_name=sweep_name)
    row["sweep_group"] = " ".join(filter(None, [sweep_name, sweep_id])) or None
    job_dir = Path(job_dir) if job_dir else store.root / "jobs" / row["run_id"]
    row["job_dir"] = str(job_dir)
    row["row_path"] = str(row_path(store, row))
    started = time.perf_counter()
    tracker = WandbRun(cfg, row, job_dir, run_name)
    try:
        tracker.start()
        row["wandb_dir"] = tracker.directory
    except Exception as err:  # noqa: BLE001 - tracking must not cost the job
        log.warning("W&B run not started: %s", err)
        tracker.run = None
    failure = None
    try:
        with stop_signals_raise(), progress_listener(tracker.progress):
            run_job(cfg, row, job_dir, tracker.stage)
    except Exception as err:  # noqa: BLE001 - every failure becomes a row
        failure = err
        row.update(status="failed", error=f"{type(err).__name__}: {err}")
        # A configuration error or a stop signal is said in one line by the job's summary (run.py);
        # anything else gets its traceback here.
        if not isinstance(err, (ConfigError, JobInterrupted)):
            where = f" in stage {row['failed_stage']}" if row.get("failed_stage") else ""
            log.error("job failed%s: %s\n%s", where, row["error"], traceback.format_exc())
    row["time_total_s"] = time.perf_counter() - started
    try:
        tracker.finish(row)
    except Exception as err:  # noqa: BLE001 - tracking must not cost the row
        log.warning("W&B logging failed: %s", err)
    try:
        path = store.write(row)
    except OSError as err:  # e.g. a full disk: say so in one line; no partial row file is left
        log.error("row of run %s not written under %s: %s", row["run_id"], store.runs, err)
        raise
    if failure is not None:
        log.debug("failed row written to %s", path)
        if raise_on_failure or isinstance(failure, JobInterrupted):
            failure.row = row  # what the caller reports before it stops
            raise failure
    return row
