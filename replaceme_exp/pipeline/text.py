"""Language models: calibration text (with masked copies), held-out windows, perplexity, lm-eval
and generation samples."""

from __future__ import annotations

import dataclasses

from replaceme_exp.config import schema
from replaceme_exp.data.augmentation import with_masked_copies
from replaceme_exp.data.batching import with_counted_positions
from replaceme_exp.data.calibration import Answerer, build_calibration, heldout_windows
from replaceme_exp.errors import ConfigError, check_finite
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.evaluation.harness import harness_settings, protocol_version_columns, run_harness
from replaceme_exp.evaluation.perplexity import WindowPerplexity, window_perplexity
from replaceme_exp.evaluation.samples import answers_alone, greedy_answers, side_by_side
from replaceme_exp.models.loading import LoadedModel
from replaceme_exp.pipeline.modalities import MODALITIES
from replaceme_exp.pipeline.modality import Calibration, Modality, UnprunedScores
from replaceme_exp.results.row import library_versions
from replaceme_exp.stages import stage


@MODALITIES.register("text")
class TextModality(Modality):
    name = "text"

    @classmethod
    def check_eval(cls, c: schema.JobConfig) -> None:
        if isinstance(c.eval, schema.ImageEvalConfig):
            reason = "are image benchmarks, for vision encoders (model=clip_vit_l14)"
            raise ConfigError("eval.benchmarks", c.eval.benchmarks, reason)

    def calibration(self, loaded: LoadedModel, adapter) -> Calibration:
        c = self.config
        with stage("data"):
            answerer = Answerer(loaded.model, loaded.identity_hash, str(self.paths.cache_dir))
            batches = build_calibration(c.calibration, loaded.tokenizer, answerer)
            check_token_ids(batches, loaded, c.model, "calibration")
            if self.spec.effective.padded_positions:  # padded positions run as the official code runs them
                batches = with_counted_positions(batches)
            # Masking is augmentation of the estimation data: the plain sequences plus masked copies.
            estimation = (
                with_masked_copies(batches, float(c.mask_ratio), c.mask_passes, int(c.seed))
                if float(c.mask_ratio)
                else batches
            )
        counts = {
            "n_calib_tokens": batches.n_tokens,
            "n_estimation_tokens": estimation.n_tokens,
            # how chats are rendered: the tokenizer's template, or "role: content" turns without one
            # (a base model such as Llama 2 7B; docs/paper-vs-official.md)
            "chat_template": bool(getattr(loaded.tokenizer, "chat_template", None)),
        }
        return Calibration(batches, estimation, counts)

    def heldout(self, loaded: LoadedModel, adapter):
        windows = heldout_windows(self.config.eval, loaded.tokenizer)
        check_token_ids(windows, loaded, self.config.model, "eval")
        return windows

    def evaluate_unpruned(
        self, loaded: LoadedModel, adapter, heldout, baselines: BaselineCache, device
    ) -> UnprunedScores:
        c, model, tokenizer = self.config, loaded.model, loaded.tokenizer
        key = {"model": loaded.identity_hash, "windows": heldout.content_hash(), "metric": "ppl_heldout"}
        with stage("eval", "baseline perplexity"):
            found = baselines.get_or_compute(key, lambda: finite_perplexity(model, heldout).to_json())
            unpruned = WindowPerplexity.from_json(found, heldout.content_hash(), heldout.documents)
            columns = {**unpruned.columns("ppl_heldout_baseline"), **unpruned.unit_columns()}
        if (harness := c.eval.harness) is not None:
            with stage("eval", "baseline lm-eval"):
                settings = harness_settings(harness)
                columns.update(settings)
                columns.update(protocol_version_columns(c.protocol))
                key = {
                    "model": loaded.identity_hash,
                    "metric": "harness",
                    "harness": dataclasses.asdict(harness),
                    "settings": settings,
                    "libraries": library_versions(),
                }
                scores = baselines.get_or_compute(key, lambda: self.harness_scores(loaded))
                check_finite("eval", "the unpruned model's avg_acc is", [scores["avg_acc"]])
                columns["avg_acc_baseline"] = scores["avg_acc"]
                columns.update({f"baseline_{name}": value for name, value in scores.items()})
        answers = None
        if (samples := c.eval.samples) is not None:
            with stage("eval", "generation samples (unpruned)"):
                answers = greedy_answers(model, tokenizer, list(samples.prompts), samples.max_new_tokens)
        return UnprunedScores(columns, answers)

    def quality(self, loaded: LoadedModel, heldout, healed: bool = False) -> dict:
        which = "healed" if healed else "pruned"
        with stage("eval", f"{which} perplexity"):
            measured = finite_perplexity(loaded.model, heldout, which)
        return {**measured.columns("ppl_heldout"), **measured.unit_columns()}

    def harness_scores(self, loaded: LoadedModel) -> dict:
        """The lm-eval suite's score columns of ``loaded`` (:func:`run_harness`)."""
        return run_harness(loaded.model, loaded.tokenizer, self.config.eval.harness, self.paths.job_dir)

    def evaluate_pruned(self, loaded: LoadedModel, adapter, heldout, unpruned: UnprunedScores, device) -> dict:
        c, model, tokenizer = self.config, loaded.model, loaded.tokenizer
        columns = {}
        if c.eval.harness is not None:
            with stage("eval", "pruned lm-eval"):
                columns.update(self.harness_scores(loaded))
                check_finite("eval", "the pruned model's avg_acc is", [columns["avg_acc"]])
                columns["rp"] = columns["avg_acc"] / unpruned.columns["avg_acc_baseline"]
        if (samples := c.eval.samples) is not None:
            with stage("eval", "generation samples (pruned)"):
                pruned = greedy_answers(model, tokenizer, list(samples.prompts), samples.max_new_tokens)
            columns["generation_samples"] = side_by_side(list(samples.prompts), unpruned.answers, pruned)
        return columns

    def evaluate_model(self, loaded: LoadedModel, adapter) -> dict:
        c, model, tokenizer = self.config, loaded.model, loaded.tokenizer
        heldout = self.heldout(loaded, adapter)
        with stage("eval", "perplexity"):
            measured = finite_perplexity(model, heldout, "evaluated")
            columns = {**measured.columns("ppl_heldout"), **measured.unit_columns()}
        if (harness := c.eval.harness) is not None:
            with stage("eval", "lm-eval"):
                columns.update(harness_settings(harness))
                columns.update(protocol_version_columns(c.protocol))
                columns.update(self.harness_scores(loaded))
                check_finite("eval", "the evaluated model's avg_acc is", [columns["avg_acc"]])
        if (samples := c.eval.samples) is not None:
            with stage("eval", "generation samples"):
                answers = greedy_answers(model, tokenizer, list(samples.prompts), samples.max_new_tokens)
            columns["generation_samples"] = answers_alone(list(samples.prompts), answers)
        return columns


def check_token_ids(batches, loaded: LoadedModel, model, data: str) -> None:
    """Every token id of ``batches`` has a row in the model's input embedding, before the model
    reads them (an id past it fails in the embedding's lookup with no word of the vocabulary)."""
    rows = loaded.model.get_input_embeddings().num_embeddings
    largest = max((int(b.input_ids.max()) for b in batches if b.input_ids.numel()), default=-1)
    if largest < rows:
        return
    random = model.source == "random"
    key, value = ("model.config.vocab_size", rows) if random else ("model.pretrained", model.pretrained)
    reason = f"its input embedding has {rows} rows, but the {data} text's tokens reach id {largest} (its tokenizer's)"
    raise ConfigError(key, value, reason)


def finite_perplexity(model, windows, which: str = "unpruned") -> WindowPerplexity:
    """The ``which`` model's held-out perplexity, window by window, refused (and so, unpruned, never
    cached) when not finite."""
    measured = window_perplexity(model, windows)
    check_finite("eval", f"the {which} model's held-out perplexity is", [measured.value])
    return measured
