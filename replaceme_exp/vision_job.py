"""One job on a vision encoder (CLIP's image tower): image calibration -> capture -> selection ->
estimation -> surgery -> zero-shot benchmarks -> results row.

The stages are the decoder job's (the same capture, selection, estimators and surgery through
:class:`~replaceme_exp.models.adapters.ClipVisionAdapter`); what differs is the data (images,
every position a token) and the evaluation (clip-benchmark's zero-shot classification and
retrieval instead of perplexity and lm-eval). Row columns per benchmark follow the paper's CLIP
table: ``acc1_cifar10``, ``acc5_cifar10``, ``mean_avg_p_voc2007``, ``acc1_eurosat``,
``acc5_eurosat``, ``text_recall5_mscoco``, ``vision_recall5_mscoco``, each with ``baseline_<column>``
for the unpruned model (cached per model and benchmark settings).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from hydra.utils import instantiate, to_absolute_path
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import capture_precision, plan_execution
from replaceme_exp.capture.runner import input_device
from replaceme_exp.capture.statistics import PLACEMENTS
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.data.images import build_image_calibration
from replaceme_exp.errors import ConfigError, check_finite
from replaceme_exp.estimation.fitting import estimate
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.evaluation.clip_benchmarks import BENCHMARKS_VERSION, LIBRARIES, benchmark_task, evaluate_benchmark
from replaceme_exp.job import (
    cached_stages,
    device_name,
    effective_method_columns,
    effective_regularizer,
    finish_row,
    heldout_distances_pass,
    library_versions,
    token_rule_columns,
)
from replaceme_exp.models.adapters import adapter_for, count_parameters
from replaceme_exp.models.loading import load_model
from replaceme_exp.planning import capture_calibration, selection_metric_name
from replaceme_exp.surgery import prune, save_checkpoint

log = logging.getLogger(__name__)

# clip-benchmark metric -> the paper table's column stem, per benchmark
COLUMN_NAMES = {
    "acc1": "acc1",
    "acc5": "acc5",
    "mean_per_class_recall": "mean_per_class_recall",
    "mean_average_precision": "mean_avg_p",
    "text_retrieval_recall@5": "text_recall5",
    "image_retrieval_recall@5": "vision_recall5",
}
BENCHMARK_SUFFIX = {"voc2007_multilabel": "voc2007", "vtab/eurosat": "eurosat", "mscoco_captions": "mscoco"}


def benchmark_columns(name: str, metrics: dict[str, float]) -> dict[str, float]:
    """``{metric}_{benchmark}`` columns of one benchmark's clip-benchmark metrics."""
    suffix = BENCHMARK_SUFFIX.get(name, name)
    return {f"{COLUMN_NAMES.get(metric, metric)}_{suffix}": value for metric, value in metrics.items()}


def refuse_text_only_settings(cfg: DictConfig) -> None:
    """Settings whose data or evaluation is text: refused for a vision encoder, in one line."""
    if cfg.healing.name != "none":
        raise ConfigError("healing", cfg.healing.name, "healing trains on text; not for a vision encoder")
    if float(cfg.mask_ratio):
        raise ConfigError("mask_ratio", float(cfg.mask_ratio), "token masking is for text calibration")
    if cfg.multi_lt == "sequential" and not (cfg.cuts is None and cfg.num_lts == 1):
        raise ConfigError("multi_lt", "sequential", "not for a vision encoder (its held-out check reads text)")
    if cfg.model.get("capture_4bit"):
        raise ConfigError("model.capture_4bit", True, "not for a vision encoder")
    if cfg.lt_placement not in PLACEMENTS:
        raise ConfigError("lt_placement", cfg.lt_placement, f"choose one of {PLACEMENTS}")


def prune_and_evaluate_vision(cfg: DictConfig, row: dict, timer) -> dict:
    """data -> capture -> selection -> estimation -> surgery -> evaluation for a CLIP model."""
    torch.manual_seed(int(cfg.seed))
    refuse_text_only_settings(cfg)
    benchmarks = list(cfg.eval.get("benchmarks") or [])
    for name in benchmarks:
        benchmark_task(name)  # an unknown name is refused before loading
    cache_dir, results_dir = to_absolute_path(cfg.cache_dir), to_absolute_path(cfg.results_dir)
    estimator = instantiate(cfg.objective)
    token_rule = TokenRule.from_config(cfg.get("estimation"))
    row.update(token_rule_columns(token_rule, estimator, cfg))
    row["regularizer"] = effective_regularizer(cfg, estimator)
    row["alpha_scale"] = estimator.alpha_scale if estimator.uses_alpha else None
    row.update(effective_method_columns(cfg, estimator))
    execution = plan_execution(cfg, cache_dir=cache_dir)
    log.info("capture plan: %s", execution.reason)
    row.update(capture_mode=execution.mode, capture_precision=capture_precision(cfg), capture_plan=execution.reason)
    model_cfg = cfg.model
    if execution.mode == "layerwise":
        model_cfg = OmegaConf.merge(cfg.model, {"device": "cpu", "device_map": None})
    with timer("load"):
        loaded = load_model(model_cfg, cache_dir, row.get("model_fingerprint"))
    model, processor = loaded.model, loaded.processor
    adapter = adapter_for(model)
    adapter.execution = execution
    if estimator.fits_transform and cfg.lt_placement == "fused":
        adapter.require_fusable()
    row["model_revision"] = loaded.identity.get("commit")
    patch = int(adapter.config.patch_size)
    with timer("data"):
        calibration = build_image_calibration(cfg.calibration, processor, patch, cache_dir)
    row.update(n_calib_tokens=calibration.n_tokens, n_estimation_tokens=calibration.n_tokens)
    row["calib_seq_len"] = calibration.seq_len  # image positions (patches and the class token)
    cache = StatisticsCache(
        to_absolute_path(cfg.capture.cache_dir),
        loaded.identity_hash,
        calibration.content_hash(),
        bool(cfg.capture.cache),
        bool(cfg.force),
    )
    if cfg.cuts is None:
        row["selection_metric"] = selection_metric_name(cfg.selection)
    needs_tokens = getattr(estimator, "needs_tokens", False)
    cuts, distances, stats = capture_calibration(
        cfg, adapter, calibration, cache, estimator.needs_statistics, timer, compute_missing=not needs_tokens
    )
    row.update(cuts=[list(c) for c in cuts], num_lts=len(cuts), n_prune=sum(e - s for s, e in cuts))
    if distances is not None:
        check_finite("selection", "the candidate distances are", distances.values())
        row["candidate_distances"] = [[s, e, distances[(s, e)]] for s, e in sorted(distances)]
        row["selection_distance"] = float(min(distances[c] for c in cuts if c in distances))
    for cut, s in stats.items():
        check_finite("capture", f"the statistics of cut {list(cut)} are", [s.mtm, s.mtr, s.r_sq])
    transforms = estimate(cfg, adapter, calibration, estimator, cuts, stats, row, timer)
    device = input_device(adapter)
    row.update(num_layers=adapter.num_layers, device=device_name(device), params_before=count_parameters(model))

    heldout_cfg = cfg.eval.get("heldout_images")
    if heldout_cfg:
        with timer("data", "held-out images"):
            heldout = build_image_calibration(heldout_cfg, processor, patch, cache_dir)
        with timer("eval", "held-out distances"):
            before, after, l2, columns = heldout_distances_pass(
                adapter, heldout, transforms, cfg.lt_placement, token_rule.massive_threshold
            )
        row.update(cos_dist_before=before, cos_dist_after=after, l2_dist_before=l2, **columns)
        check_finite("eval", "the held-out distances are", [before, after])

    baselines = BaselineCache(Path(results_dir) / "baselines", refresh=bool(cfg.force))
    settings = {
        "batch_size": int(cfg.eval.batch_size),
        "limit": cfg.eval.get("limit"),
        "amp": bool(cfg.eval.get("amp", False)),
    }
    row.update({f"eval_{k}": v for k, v in settings.items()}, eval_benchmarks=benchmarks)
    row.update({f"{package}_version": v for package, v in library_versions(LIBRARIES).items()})

    def scores(name: str) -> dict[str, float]:
        return evaluate_benchmark(
            model,
            adapter,
            loaded.tokenizer,
            processor,
            name,
            settings["batch_size"],
            device,
            settings["limit"],
            settings["amp"],
        )

    for name in benchmarks:
        key = {
            "model": loaded.identity_hash,
            "metric": f"clip/{name}",
            "benchmarks_version": BENCHMARKS_VERSION,
            "libraries": library_versions(LIBRARIES),
            **settings,
        }
        with timer("eval", f"baseline {name}"):
            baseline = baselines.get_or_compute(key, lambda name=name: scores(name))
        row.update({f"baseline_{c}": v for c, v in benchmark_columns(name, baseline).items()})
    with timer("surgery"):
        kept = prune(adapter, cuts, transforms, cfg.lt_placement)
    row.update(params_after=count_parameters(model), kept_blocks=kept)
    row["compression_ratio"] = 1.0 - row["params_after"] / row["params_before"]
    row["vision_compression_ratio"] = row["n_prune"] / row["num_layers"]  # the paper's 13% / 25%: blocks removed
    for name in benchmarks:
        with timer("eval", f"pruned {name}"):
            row.update(benchmark_columns(name, scores(name)))
    row["cached_stages"] = cached_stages(cache, cache, baselines)

    if cfg.save_model:
        with timer("save"):
            target = Path(results_dir) / "models" / f"{row['config_hash']}"
            metadata = {
                k: row[k] for k in ("run_id", "config_hash", "model", "cuts", "objective", "alpha", "kept_blocks")
            }
            save_checkpoint(model, loaded.tokenizer, target, metadata, processor)
            row["pruned_model_path"] = str(target)
    return finish_row(row, timer, device)
