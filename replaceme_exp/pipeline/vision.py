"""Vision encoders (CLIP's image tower): image calibration (every image position a token), held-out
distances on an image set, and clip-benchmark's zero-shot classification and retrieval.

Row columns per benchmark follow the paper's CLIP table: ``acc1_cifar10``, ``acc5_cifar10``,
``mean_avg_p_voc2007``, ``acc1_eurosat``, ``acc5_eurosat``, ``text_recall5_mscoco``,
``vision_recall5_mscoco``, each with ``baseline_<column>`` for the unpruned model (cached per
model and benchmark settings)."""

from __future__ import annotations

import torch

from replaceme_exp.capture.hooks import input_device
from replaceme_exp.config import schema
from replaceme_exp.config.validate import build_option
from replaceme_exp.data.calibration import drawn
from replaceme_exp.data.images import build_image_calibration
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.errors import ConfigError
from replaceme_exp.evaluation.clip_benchmarks import BENCHMARKS_VERSION, LIBRARIES, benchmark_task, evaluate_benchmark
from replaceme_exp.models.loading import LoadedModel
from replaceme_exp.pipeline.modalities import MODALITIES
from replaceme_exp.pipeline.modality import Calibration, Modality, UnprunedScores
from replaceme_exp.results.row import library_versions
from replaceme_exp.selection.metrics import METRICS
from replaceme_exp.stages import stage

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


@MODALITIES.register("vision")
class VisionModality(Modality):
    name = "vision"

    @classmethod
    def check(cls, c: schema.JobConfig) -> None:
        """Image data and benchmarks; text-only settings refused."""
        name = c.model.name
        if c.protocol == "official":
            reason = f"the official code has no CLIP path: model={name} runs under protocol=paper"
            raise ConfigError("protocol", "official", reason)
        cls.check_eval(c)
        if c.healing.name != "none":
            raise ConfigError("healing", c.healing.name, "healing trains on text; not for a vision encoder")
        if c.eval.samples is not None:
            reason = "are text generation; not for a vision encoder (eval.samples=null)"
            raise ConfigError("eval.samples", c.eval.samples.prompts, reason)
        if float(c.mask_ratio):
            raise ConfigError("mask_ratio", float(c.mask_ratio), "token masking is for text calibration")
        if c.multi_lt == "sequential" and not (c.cuts is None and c.num_lts == 1):
            raise ConfigError("multi_lt", "sequential", "not for a vision encoder (its held-out check reads text)")
        if c.model.capture_4bit:
            raise ConfigError("model.capture_4bit", True, "not for a vision encoder")
        if c.cuts is None and METRICS.get(c.selection.metric).text_only:
            reason = "runs a language model on text; not for a vision encoder"
            raise ConfigError("selection.metric", c.selection.metric, reason)

    @classmethod
    def check_eval(cls, c: schema.JobConfig) -> None:
        if not isinstance(c.eval, schema.ImageEvalConfig):
            raise ConfigError("eval", c.eval.name, f"has no image benchmarks for model={c.model.name} (eval=clip)")
        for benchmark in c.eval.benchmarks:
            benchmark_task(benchmark)
        if c.eval.speed.enabled:
            reason = f"times prefill and decoding of a language model; model={c.model.name} is a vision encoder"
            raise ConfigError("eval.speed.enabled", True, reason + " (eval.speed.enabled=false)")

    def patch_size(self, adapter) -> int:
        return int(adapter.config.patch_size)

    def calibration(self, loaded: LoadedModel, adapter) -> Calibration:
        with stage("data"):
            batches = build_image_calibration(
                drawn(self.config.calibration), loaded.processor, self.patch_size(adapter), self.paths.cache_dir
            )
        columns = {"n_calib_tokens": batches.n_tokens, "n_estimation_tokens": batches.n_tokens}
        columns["calib_seq_len"] = batches.seq_len  # image positions (patches and the class token)
        return Calibration(batches, batches, columns)

    def heldout(self, loaded: LoadedModel, adapter):
        images = self.config.eval.heldout_images
        if not images:
            return None
        image_set = build_option("calibration", {"name": "heldout_images", **images}, "eval.heldout_images")
        with stage("data", "held-out images"):
            return build_image_calibration(image_set, loaded.processor, self.patch_size(adapter), self.paths.cache_dir)

    def settings(self) -> dict:
        e = self.config.eval
        return {"batch_size": int(e.batch_size), "limit": e.limit, "amp": bool(e.amp)}

    def scores(self, loaded: LoadedModel, adapter, name: str, device: torch.device) -> dict[str, float]:
        s = self.settings()
        return evaluate_benchmark(
            loaded.model,
            adapter,
            loaded.tokenizer,
            loaded.processor,
            name,
            s["batch_size"],
            device,
            s["limit"],
            s["amp"],
        )

    def settings_columns(self) -> dict:
        """The benchmarks' settings and the versions of the libraries that score them."""
        columns = {f"eval_{k}": v for k, v in self.settings().items()}
        columns["eval_benchmarks"] = list(self.config.eval.benchmarks)
        columns.update({f"{package}_version": v for package, v in library_versions(LIBRARIES).items()})
        return columns

    def evaluate_unpruned(
        self, loaded: LoadedModel, adapter, heldout, baselines: BaselineCache, device
    ) -> UnprunedScores:
        settings = self.settings()
        columns = self.settings_columns()
        for name in self.config.eval.benchmarks:
            key = {
                "model": loaded.identity_hash,
                "metric": f"clip/{name}",
                "benchmarks_version": BENCHMARKS_VERSION,
                "libraries": library_versions(LIBRARIES),
                **settings,
            }
            with stage("eval", f"baseline {name}"):
                baseline = baselines.get_or_compute(key, lambda name=name: self.scores(loaded, adapter, name, device))
            columns.update({f"baseline_{c}": v for c, v in benchmark_columns(name, baseline).items()})
        return UnprunedScores(columns)

    def pruned_columns(self, removed: int, num_layers: int) -> dict:
        return {"vision_compression_ratio": removed / num_layers}  # the paper's 13% / 25%: blocks

    def evaluate_pruned(self, loaded: LoadedModel, adapter, heldout, unpruned: UnprunedScores, device) -> dict:
        return self.benchmark_scores(loaded, adapter, device, "pruned ")

    def evaluate_model(self, loaded: LoadedModel, adapter) -> dict:
        return {**self.settings_columns(), **self.benchmark_scores(loaded, adapter, input_device(adapter))}

    def benchmark_scores(self, loaded: LoadedModel, adapter, device: torch.device, label: str = "") -> dict:
        """Every benchmark's score columns of ``loaded``, inputs on ``device`` (stages ``<label><benchmark>``)."""
        columns = {}
        for name in self.config.eval.benchmarks:
            with stage("eval", f"{label}{name}"):
                columns.update(benchmark_columns(name, self.scores(loaded, adapter, name, device)))
        return columns
