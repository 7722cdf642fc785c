"""What a job is: its configuration resolved once into the settings that act.

:meth:`JobSpec.from_config` applies the job's ``protocol`` (:mod:`replaceme_exp.pipeline.protocol`:
under ``protocol=official`` the official code's settings), checks the configuration (every key,
every cross-key rule),
applies what the estimator declares (:class:`~replaceme_exp.estimation.Requirements`) and decides,
in one place, what each setting does:

- settings that cannot act are dropped (the row shows None, the hash leaves them out): selection
  with explicit ``cuts``; merging and ``multi_lt`` for a single selected cut; masking keys when
  ``mask_ratio`` is 0; solver settings of closed forms (Adam is mini-batch under either schedule);
  ``estimation.first`` unless ``estimation.tokens=skip_first``; ``healing.master_weights`` unless
  low-precision weights train (``full_model``, or ``lt_only`` with the separate placement, on a
  bfloat16 / float16 model; the hash keeps it only at ``float32``, so ``model`` keeps the hash its
  rows had before the key existed); ``record_calibration_similarity`` unless true (likewise);
- settings that act in one way only take their canonical value: the regulariser and alpha when
  the objective takes no alpha or alpha is 0 (``none``, 0); the structure and placement of
  ``identity`` (``generic``, ``fused``); the token rule when nothing is fitted (``all``).

The config hash (:attr:`JobSpec.config_hash`), the setting hash and the row's setting columns
(:meth:`JobSpec.setting_columns`) all come from these effective settings, so equivalent spellings
(``alpha=0`` and ``alpha=0.0``; a preset and its expansion; ``regularizer=none`` vs ``l2`` at
alpha 0) share one hash and one description. Keys that change where or how a job runs, not what
it computes, stay out of the hash (``results_dir``, ``cache_dir``, ``save_model``, ``save_transforms``, ``force``,
``capture`` except a float32 precision that acts and ``last_state=final_norm``, ``store``, ``tracking``,
``progress``, ``model.device``, ``model.device_map``, ``eval.samples``, ``eval.speed``, ``healing.log_every``,
``healing.gradient_checkpointing``); local data files and the model's weights enter by content.
``SEMANTICS_VERSION`` is bumped whenever the code changes what a configuration computes.

An evaluate job (``job=evaluate``) computes only the eval suite's scores of one model: ``model``, or
``evaluate.checkpoint`` loaded as a local checkpoint (:func:`evaluated`). Its hash is taken over that
model (its weights by content, its dtype) and the eval suite alone; every pruning setting is None in
its row. A pruning job's identity leaves ``job`` and ``evaluate`` out (its hash is as before they
existed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig

from replaceme_exp.capture.execution import CaptureExecution, compute_device, resolve_precision
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.config import schema
from replaceme_exp.config.protocol import settle
from replaceme_exp.config.store import group_shapes
from replaceme_exp.config.validate import typed_config
from replaceme_exp.data.calibration import empty_records_act, sample_seed
from replaceme_exp.estimation.estimators import Estimator, Requirements, estimator_class
from replaceme_exp.estimation.fitting import FitRequest
from replaceme_exp.healing import HEALING_LABELS
from replaceme_exp.methods import (
    job_methods,
    label_of,
    method_of_objective,
    method_of_selection,
    method_setting_columns,
)
from replaceme_exp.models.fingerprint import file_digest
from replaceme_exp.models.loading import nf4_unquantised_dtype, saved_dtype
from replaceme_exp.pipeline.modalities import modality_of
from replaceme_exp.pipeline.rules import (
    check_checkpoint,
    check_evaluation,
    check_inputs,
    check_job,
    model_save,
)
from replaceme_exp.selection.metrics import METRICS
from replaceme_exp.selection.passes import SelectionRequest
from replaceme_exp.storage import content_key
from replaceme_exp.surgery import REPLACEMENT_NETWORKS_FILE, SEPARATE_TRANSFORMS_FILE, checkpoint_metadata

# Bump when the code changes what an unchanged configuration computes.
SEMANTICS_VERSION = 3
# Where and how a job runs, not what it computes.
NON_SEMANTIC_KEYS = (
    "results_dir",
    "cache_dir",
    "save_model",
    "save_transforms",
    "force",
    "capture",
    "store",
    "tracking",
    "progress",
)
NON_SEMANTIC_MODEL_KEYS = ("device", "device_map")
NON_SEMANTIC_HEALING_KEYS = ("log_every", "gradient_checkpointing")
# Fields whose value names a local data file: the file enters the hash by content.
DATA_FILE_FIELDS = ("path", "prompts_path", "prompts_data_files")


@dataclass(frozen=True)
class EffectiveSettings:
    """The job's settings as they act (see the module docstring)."""

    selection_metric: str | None  # "cosine", "angular_last", ...; None with explicit cuts
    selects_by_ls: bool = field(metadata={"column": False})  # selection by the LS residual (ridge LS in the placement)
    alpha: float
    regularizer: str
    structure: str
    lt_placement: str
    estimation_tokens: str
    estimation_first: int | None
    massive_threshold: float
    merge_consecutive: bool | None
    touching_cuts: str | None  # unmerged cuts that may touch: apart / compose; None where no two cuts can
    multi_lt: str | None
    mask_passes: int | None
    capture_precision: str  # float64 or float32 on this machine
    precision_acts: bool = field(metadata={"column": False})  # float32 products feed a statistic this job uses
    healing_master_weights: str | None  # float32 / model where low-precision weights train, else None
    padded_positions: bool  # padded positions enter the fits (only where something is fitted)
    capture_dtype: str  # the dtype of the model the activations are captured on

    def columns(self) -> dict[str, Any]:
        """The row's columns of the settings as they act: every field, by its name, but those that only
        steer the job (``metadata={"column": False}``)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.metadata.get("column", True)}


@dataclass(frozen=True)
class JobSpec:
    """A job's configuration (typed, checked), what its estimator declares, and its effective
    settings; its config hash, setting hash and row setting columns.

    ``weights``: the model's weights fingerprint (:func:`~replaceme_exp.models.fingerprint.weights_fingerprint`),
    part of the hash (None: without it). ``checkpoint_metadata``: an evaluate job's checkpoint's
    ``replaceme.json`` (None: no checkpoint, or one this project did not save)."""

    config: schema.JobConfig
    requirements: Requirements
    effective: EffectiveSettings
    modality: str
    weights: dict | None = None
    checkpoint_metadata: dict | None = None

    @classmethod
    def from_config(cls, cfg: DictConfig | dict | schema.JobConfig, weights: dict | None = None) -> "JobSpec":
        """Check ``cfg`` (one :class:`~replaceme_exp.errors.ConfigError` naming key, value and reason
        for the first problem) and resolve it. Cheap: no model, no data."""
        config = settle(cfg) if isinstance(cfg, schema.JobConfig) else typed_config(cfg)
        requirements = estimator_class(config.objective).requirements(config.objective)
        metadata = None
        if config.job == "evaluate":
            config, metadata = evaluated(config)
            check_evaluation(config)
        else:
            check_job(config, requirements)
        effective = resolve(config, requirements)
        return cls(config, requirements, effective, modality_of(config.model), weights, metadata)

    def with_weights(self, weights: dict | None) -> "JobSpec":
        return dataclasses.replace(self, weights=weights)

    def check_inputs(self) -> None:
        """Read what the job will read, before its model loads (the contents of its files, the hub
        datasets it needs: :func:`~replaceme_exp.pipeline.rules.check_inputs`). Not cheap: the
        runner calls it once, for a job that is not skipped."""
        check_inputs(self.config)

    @property
    def job(self) -> str:
        """``prune`` or ``evaluate``."""
        return self.config.job

    @property
    def model_save(self) -> str | None:
        """What a finished job leaves of its pruned model (:func:`~replaceme_exp.pipeline.rules.model_save`):
        ``full``, ``transform`` or None."""
        return model_save(self.config)

    @property
    def evaluates_in_4bit(self) -> bool:
        """Whether the pruned model is scored as a 4-bit NF4 copy: under ``protocol=official`` with
        ``model.capture_4bit``, for a method whose official code evaluates it so
        (:attr:`~replaceme_exp.methods.Method.official_4bit_evaluation`), on its own selection's cuts."""
        c = self.config
        if c.protocol != "official" or not c.model.capture_4bit or method_of_selection(c) is not None:
            return False
        method = method_of_objective(c.objective)
        return method is not None and method.official_4bit_evaluation

    @property
    def saves_model(self) -> bool:
        """Whether a finished job left a model under ``results_dir/models/<config_hash>``."""
        return self.model_save == "full"

    # ---- identity -------------------------------------------------------------------------------

    def identity(self) -> dict:
        """The settings the config hash is taken over: the configuration reduced to what moves a
        number, each setting as it acts, numbers by value."""
        if self.job == "evaluate":
            return self.evaluation_identity()
        c, e = self.config, self.effective
        data = dataclasses.asdict(c)
        for key in ("job", "evaluate", *NON_SEMANTIC_KEYS):
            data.pop(key)
        for key in NON_SEMANTIC_MODEL_KEYS:
            data["model"].pop(key)
        if self.weights is not None:
            data["model"]["weights"] = self.weights
        data["eval"].pop("samples")  # what the job shows, not what it measures
        data["eval"].pop("speed")  # measures the machine, not the model (its settings are row columns)
        if c.eval.text != "documents":  # acts only on documents' windows
            data["eval"].pop("windows_per_document")
        if not data["calibration"].get("draw"):  # draw 0: the sample rows had before draws existed
            data["calibration"].pop("draw", None)
        self._estimation_as_it_acts(data)
        for method in job_methods(c):
            if method.identity is not None:
                method.identity(c, data)
        self._drop_what_does_not_act(data)
        self._healing_as_it_acts(data)
        if not c.record_calibration_similarity:  # off: the hash every row had before the key existed
            data.pop("record_calibration_similarity")
        parts = [p for p in (data["calibration"].get("parts") or {}).values() if isinstance(p, dict)]
        for section in (data["calibration"], *parts, data["eval"], data["healing"].get("data") or {}):
            self.add_file_digests(section)  # a mix part's file too (no shipped mix names one)
        if e.precision_acts:
            data["capture_precision"] = e.capture_precision  # float32 products round differently
        if c.capture.last_state != "block_output":  # the hash rows had before the key existed otherwise
            data["capture_last_state"] = c.capture.last_state
        if e.mask_passes is None:
            data["mask_ratio"] = 0
            data.pop("mask_passes")
        data["semantics_version"] = SEMANTICS_VERSION
        return _by_value(data)

    def _estimation_as_it_acts(self, data: dict) -> None:
        """In ``data`` (the config as a dict), the estimation settings as they act: the effective
        regulariser, structure, placement and tokens; the solver's schedule and precision only where
        they change the solve."""
        e = self.effective
        data["alpha"] = e.alpha
        data["regularizer"] = {"name": e.regularizer}
        data["structure"] = {"name": e.structure}
        data["lt_placement"] = e.lt_placement
        data["estimation"]["tokens"] = e.estimation_tokens
        if e.estimation_first is None:
            data["estimation"].pop("first")
        data.pop("solver_schedule")  # acts only through objective.schedule
        if self.requirements.solver == "adam":  # Adam is mini-batch under either schedule
            data["objective"].pop("schedule")
        if self.requirements.solver_precision != "float64":  # Adam's, or float32: all solvers' before the key
            data["objective"].pop("precision", None)

    def _drop_what_does_not_act(self, data: dict) -> None:
        """Remove from ``data`` the keys that do not act in this job (explicit cuts' selection, a
        search's cut count, settings at their pre-key value), so that hashes pinned before a key
        existed stay."""
        c, e = self.config, self.effective
        if c.cuts is not None:
            for key in ("selection", "n_prune", "num_lts"):
                data.pop(key)
        elif METRICS.get(c.selection.metric).searches:  # the search decides how many cuts
            data.pop("num_lts")
        if e.merge_consecutive is None:
            data.pop("merge_consecutive")
        if e.touching_cuts in (None, "apart"):
            data.pop("touching_cuts")
        if c.protocol == "paper":  # keys added after the hashes were pinned: in the hash when they act
            data.pop("protocol")
        if e.capture_dtype == c.model.dtype:
            data["model"].pop("capture_dtype")
        else:
            data["model"]["capture_dtype"] = e.capture_dtype
        if data["calibration"].get("batch_order") == "by_length":
            data["calibration"].pop("batch_order")
        if data["calibration"].get("drop_last") is False:
            data["calibration"].pop("drop_last")
        if "empty_records" in data["calibration"] and (
            data["calibration"]["empty_records"] == "drop" or not empty_records_act(c.calibration)
        ):
            data["calibration"].pop("empty_records")
        if data["calibration"].get("mix_order") == "shuffled":
            data["calibration"].pop("mix_order")
        if not e.padded_positions:
            data["estimation"].pop("padded_positions")
        if e.multi_lt is None:
            data.pop("multi_lt")

    def _healing_as_it_acts(self, data: dict) -> None:
        """``data["healing"]`` reduced to what moves a number: nothing but its name when off, its
        non-semantic keys and keys at their pre-key values removed."""
        c, e = self.config, self.effective
        if c.healing.name == "none":  # its keys only let sweeps set them
            data["healing"] = {"name": "none"}
        for key in NON_SEMANTIC_HEALING_KEYS:
            data["healing"].pop(key, None)
        if data["healing"].get("loss") == "lm":  # keys added after the hashes were pinned: in it when they act
            data["healing"].pop("loss")
            data["healing"].pop("kl_topk")
        if data["healing"].get("lr_schedule") == "constant":
            data["healing"].pop("lr_schedule")
            data["healing"].pop("min_lr_factor")
        if e.healing_master_weights != "float32":
            data["healing"].pop("master_weights", None)

    def evaluation_identity(self) -> dict:
        """An evaluate job's identity: the evaluated model (its weights by content where known, not
        its path; its dtype) and the eval suite; no pruning setting, no seed (nothing it computes
        draws from it)."""
        c = self.config
        model = dataclasses.asdict(c.model)
        for key in (*NON_SEMANTIC_MODEL_KEYS, "capture_4bit"):
            model.pop(key)
        if self.weights is not None:
            model["weights"] = self.weights
            if c.evaluate.checkpoint is not None:
                model.pop("pretrained")  # the same weights elsewhere are the same model
        evaluation = dataclasses.asdict(c.eval)
        evaluation.pop("samples")  # what the job shows, not what it measures
        evaluation.pop("speed")  # measures the machine, not the model
        if c.eval.text != "documents":
            evaluation.pop("windows_per_document")
        self.add_file_digests(evaluation)
        data = {"job": "evaluate", "model": model, "eval": evaluation, "semantics_version": SEMANTICS_VERSION}
        return _by_value(data)

    def add_file_digests(self, section: dict) -> None:
        """``<field>_sha256`` beside each field of ``section`` that names local data files: their content."""
        memo = Path(self.config.cache_dir) / "fingerprints"
        for name in DATA_FILE_FIELDS:
            paths = section.get(name)
            paths = paths if isinstance(paths, list) else [paths]
            files = [Path(p).expanduser() for p in paths if isinstance(p, str) and Path(p).expanduser().is_file()]
            if files:
                section[f"{name}_sha256"] = [file_digest(f, memo) for f in files]

    @property
    def config_hash(self) -> str:
        """Hash of the effective settings (equal for equivalent spellings)."""
        return _digest(self.identity())

    @property
    def setting_hash(self) -> str:
        """The config hash without the seed (``calibration.seed`` and ``healing.seed`` follow
        ``seed``) and the calibration draw: runs that share it differ only in the seed or the draw, the only
        runs a cell may average."""
        data = self.identity()
        data.pop("seed", None)  # an evaluate job has none
        for group in ("calibration", "healing"):
            if group in data and data[group].get("seed") == self.config.seed:
                data[group].pop("seed")
        if "calibration" in data:  # calibration draws are replicates too
            data["calibration"].pop("draw", None)
        return _digest(data)

    # ---- the row --------------------------------------------------------------------------------

    def setting_columns(self) -> dict[str, Any]:
        """The row's setting columns: each setting as it acts (None where it cannot act)."""
        if self.job == "evaluate":
            return self.evaluation_columns()
        return self.pruning_columns()

    def evaluation_columns(self) -> dict[str, Any]:
        """An evaluate job's setting columns: the pruning job's, None where they cannot act (every
        pruning setting, the seed), and what was evaluated: ``evaluated_checkpoint`` (its
        directory; None: ``model`` itself), ``pruned_config_hash`` and ``pruned_run_id`` (the
        pruning row that saved it, from its metadata; None for a checkpoint this project did not save)."""
        c, metadata = self.config, self.checkpoint_metadata or {}
        checkpoint = c.model.pretrained if c.evaluate.checkpoint is not None else None
        # a separate T or an FFN rides beside the weights (re-attached on loading): not a plain checkpoint
        beside = (SEPARATE_TRANSFORMS_FILE, REPLACEMENT_NETWORKS_FILE)
        separate = checkpoint is not None and any((Path(checkpoint) / name).is_file() for name in beside)
        columns = dict.fromkeys(self.pruning_columns())
        columns.update(
            {
                "job": "evaluate",
                "method": "evaluation",
                "modality": self.modality,
                "model": c.model.name,
                "dtype": str(c.model.dtype),
                "capture_4bit": False,
                "eval": c.eval.name,
                **self.eval_columns(),
                "evaluated_checkpoint": checkpoint,
                "plain_checkpoint": None if checkpoint is None else not separate,
                "pruned_config_hash": metadata.get("config_hash"),
                "pruned_run_id": metadata.get("run_id"),
            }
        )
        return columns

    def pruning_columns(self) -> dict[str, Any]:
        """A pruning job's setting columns: those the schema's fields declare (``key(column=...)``: a
        setting as given), the estimator's (:meth:`~replaceme_exp.estimation.estimators.Requirements.columns`),
        the settings as they act (:meth:`EffectiveSettings.columns`), the methods' own, and those derived
        here."""
        c, e, r = self.config, self.effective, self.requirements
        shapes = group_shapes()
        healing = c.healing.name != "none"
        return {
            "job": "prune",
            "method": method_of(c, e),
            "modality": self.modality,
            **schema.declared_columns(c, (schema.JobConfig,)),
            **schema.declared_columns(c.model, shapes["model"]),
            **schema.declared_columns(c.calibration, shapes["calibration"]),
            "calibration_sample_seed": sample_seed(c.calibration),
            "calibration_empty_records": c.calibration.empty_records if empty_records_act(c.calibration) else None,
            **self.file_columns("calibration", c.calibration),
            **schema.declared_columns(c.objective, shapes["objective"]),
            **r.columns(),
            **e.columns(),
            "plain_checkpoint": (e.lt_placement == "fused" or not r.fits_transform) and not r.beside_weights,
            **schema.declared_columns(c.healing, shapes["healing"]),
            # every healing setting (lr, steps, batch, context, data, LoRA rank, ...) as the job runs it
            "healing_settings": healing_settings(c.healing) if healing else None,
            "healing_data": c.healing.data.name if healing else None,
            **self.file_columns("healing_data", c.healing.data if healing else None),
            # as given (a fraction of the depth or a count; None with explicit cuts): n_prune becomes the
            # blocks removed, which a search that stops short leaves below what was asked
            "n_prune_asked": c.n_prune if c.cuts is None else None,
            **self.selection_setting_columns(),
            **schema.declared_columns(c.eval, shapes["eval"]),
            **self.eval_columns(),
            **schema.declared_columns(c.capture, shapes["capture"]),
            **method_setting_columns(c),
        }

    def selection_setting_columns(self) -> dict[str, Any]:
        """``selection_<key>`` for each key of a selection shape beyond ``metric`` and ``tokens`` (a
        search's own settings, e.g. ``window``, ``early_barrier``), its value
        where the job's selection has it and selects (None otherwise)."""
        c, base = self.config, {f.name for f in dataclasses.fields(schema.SelectionConfig)}
        names = [f.name for shape in schema.GROUP_SHAPES["selection"] for f in dataclasses.fields(shape)]
        selects = c.cuts is None
        return {
            f"selection_{name}": getattr(c.selection, name, None) if selects else None
            for name in dict.fromkeys(names)
            if name not in base
        }

    def eval_columns(self) -> dict[str, Any]:
        """What the held-out perplexity is measured on (text models; None for a vision encoder,
        whose ``eval.seq_len`` / ``max_windows`` / ``text`` do not act): ``eval_text`` (which text),
        ``eval_seq_len``, ``eval_max_windows`` and ``eval_windows_per_document`` (the windows:
        ``max_windows=8`` instead of 32 moves SmolLM2's unpruned pydoc perplexity from 21.21 to 22.45),
        and the text file's path and
        content (``eval_text_path``, ``eval_text_sha256``; None for the shipped pydoc text)."""
        e = self.config.eval
        text = self.modality == "text"
        return {
            "eval_text": e.text if text else None,
            "eval_seq_len": int(e.seq_len) if text else None,
            "eval_max_windows": int(e.max_windows) if text else None,
            "eval_windows_per_document": int(e.windows_per_document) if text and e.text == "documents" else None,
            **self.file_columns("eval_text", e if text and e.text == "text_file" else None),
        }

    def file_columns(self, prefix: str, section) -> dict[str, Any]:
        """``<prefix>_path`` and ``<prefix>_sha256``: the local data files a config section names
        (its :data:`DATA_FILE_FIELDS`, and those of a ``mix``'s parts), as absolute paths, and their
        contents' SHA-256; one value for one file, a list for several, None for none (or no
        ``section``). A path that is no file (a folder of images) is named, with digest None."""
        files = data_files(dataclasses.asdict(section)) if section is not None else []
        memo = Path(self.config.cache_dir) / "fingerprints"
        digests = [file_digest(f, memo) if f.is_file() else None for f in files]
        paths = [str(f.absolute()) for f in files]
        one = len(files) == 1
        return {
            f"{prefix}_path": (paths[0] if one else paths) or None,
            f"{prefix}_sha256": (digests[0] if one else digests) or None,
        }

    @property
    def token_rule(self) -> TokenRule:
        """Which calibration tokens enter the fits, as it acts."""
        e = self.effective
        return TokenRule(e.estimation_tokens, e.estimation_first or 1, e.massive_threshold, e.padded_positions)

    def selection_request(self, execution: CaptureExecution | None = None) -> SelectionRequest:
        """What the selection and statistics passes need (``execution``: the capture plan, None:
        whole-model with the default statistics budget)."""
        c, e = self.config, self.effective
        return SelectionRequest(
            cuts=[tuple(cut) for cut in c.cuts] if c.cuts is not None else None,
            n_prune=c.n_prune,
            num_lts=c.num_lts,
            merge_consecutive=bool(c.merge_consecutive),
            metric=METRICS.get(c.selection.metric),
            tokens=c.selection.tokens,
            alpha=float(c.alpha),
            placement=c.lt_placement,
            rule=self.token_rule,
            precision=e.capture_precision,
            passes=c.capture.passes,
            max_stats_gb=c.capture.max_stats_gb,
            execution=execution,
            touching_cuts=e.touching_cuts or "apart",
            sequential=e.multi_lt == "sequential",
            settings=c.selection,
            seed=int(c.seed),
            extra_blocks=self.requirements.extra_blocks,
            folds=self.requirements.statistic_folds,
            drop_candidates=bool(c.capture.drop_candidates),
        )

    def fit_request(self, execution: CaptureExecution | None = None) -> FitRequest:
        """How the transforms are fitted (``execution``: the capture plan of their captures, None:
        whole-model)."""
        c, e = self.config, self.effective
        return FitRequest(
            alpha=float(c.alpha),
            regularizer=e.regularizer,
            structure=c.structure.name,
            seed=int(c.seed),
            placement=c.lt_placement,
            rule=self.token_rule,
            precision=e.capture_precision,
            store=c.store,
            owner=self.config_hash,
            execution=execution,
            needs=self.requirements,
        )

    def estimator(self) -> Estimator:
        """The estimator of ``objective`` (built from its ``_target_`` and its keys)."""
        objective = dataclasses.asdict(self.config.objective)
        return get_class(objective.pop("_target_"))(**objective)


def healing_settings(healing: schema.HealingConfig) -> dict[str, Any]:
    """Every healing setting as the job runs it, without those that cannot act: ``kl_topk`` unless
    the loss is the top-k distillation ``topk_kl``, ``min_lr_factor`` under a constant learning rate."""
    settings = dataclasses.asdict(healing)
    if settings.get("loss") != "topk_kl":
        settings.pop("kl_topk", None)
    if settings.get("lr_schedule") == "constant":
        settings.pop("min_lr_factor", None)
    return settings


def method_of(c: schema.JobConfig, e: EffectiveSettings) -> str:
    """The row's ``method``: the job's method as its plugin names it
    (:func:`~replaceme_exp.methods.label_of`), then the
    healing that trained the pruned model afterwards (`` + LoRA healing``, and its loss when it is
    not the language-modelling one)."""
    method = label_of(c, e.selection_metric)
    if c.healing.name != "none":
        method += f" + {HEALING_LABELS.get(c.healing.name, c.healing.name + ' healing')}"
        if c.healing.loss != "lm":
            method += f" ({c.healing.loss})"
    return method


def data_files(section: dict) -> list[Path]:
    """The local data files a config section (as a dict) names: its :data:`DATA_FILE_FIELDS` and,
    for a ``mix``, each part's ``path``; in that order, as given (user paths expanded)."""
    values = [section.get(name) for name in DATA_FILE_FIELDS]
    values += [part.get("path") for part in (section.get("parts") or {}).values() if isinstance(part, dict)]
    flat = [v for value in values for v in (value if isinstance(value, list) else [value])]
    return [Path(v).expanduser() for v in flat if isinstance(v, str) and v]


def evaluated(config: schema.JobConfig) -> tuple[schema.JobConfig, dict | None]:
    """An evaluate job's configuration with ``model`` the model it evaluates, and the checkpoint's
    metadata. ``evaluate.checkpoint`` (checked: a model directory) becomes a ``local`` model named
    after the model it was pruned from (its metadata; else the directory's name), in
    ``evaluate.dtype``, else the dtype it was saved in, else ``model.dtype``, on ``model``'s device;
    without it, ``model`` itself (in ``evaluate.dtype`` when given). No 4-bit copy: nothing is captured."""
    c, e = config, config.evaluate
    if e.checkpoint is None:
        model = dataclasses.replace(c.model, dtype=e.dtype or c.model.dtype, capture_4bit=False)
        return dataclasses.replace(c, model=model), None
    check_checkpoint("evaluate.checkpoint", e.checkpoint)
    path = Path(str(e.checkpoint)).expanduser().absolute()
    metadata = checkpoint_metadata(path)
    model = schema.PretrainedModelConfig(
        name=str((metadata or {}).get("model") or path.name),
        source="local",
        pretrained=str(path),
        revision=None,
        dtype=e.dtype or saved_dtype(path) or c.model.dtype,
        device=c.model.device,
        device_map=c.model.device_map,
        capture_4bit=False,
    )
    return dataclasses.replace(c, model=model), metadata


def resolve(config: schema.JobConfig, requirements: Requirements) -> EffectiveSettings:
    """What each setting of ``config`` does under an estimator with ``requirements``."""
    c, r = config, requirements
    selects = c.cuts is None
    metric = METRICS.get(c.selection.metric) if selects else None
    selects_by_ls = selects and metric.uses_statistics
    uses_alpha = r.uses_alpha and c.alpha != 0
    fitted = r.fits or selects_by_ls
    estimation_tokens = c.estimation.tokens if fitted else "all"
    precision = resolve_precision(c.capture.precision, compute_device(c.capture))
    takes_products = r.fits or (selects and metric.takes_products) or c.record_calibration_similarity
    single_cut = selects and c.num_lts == 1 or selects and metric.searches  # a search's cuts: as it finds them
    return EffectiveSettings(
        selection_metric=metric.column_name(c.selection.tokens) if selects else None,
        selects_by_ls=selects_by_ls,
        alpha=float(c.alpha) if uses_alpha or selects_by_ls else 0.0,
        regularizer=c.regularizer.name if uses_alpha else "none",
        structure=c.structure.name if r.fits_transform else "generic",
        lt_placement=c.lt_placement if r.fits_transform or selects_by_ls else "fused",
        estimation_tokens=estimation_tokens,
        estimation_first=c.estimation.first if estimation_tokens == "skip_first" else None,
        massive_threshold=c.estimation.massive_threshold,
        merge_consecutive=None if single_cut else c.merge_consecutive,
        touching_cuts=None if single_cut or c.merge_consecutive else c.touching_cuts,
        multi_lt=None if single_cut else c.multi_lt,
        mask_passes=c.mask_passes if float(c.mask_ratio) else None,
        capture_precision=precision,
        precision_acts=precision != "float64" and takes_products,
        healing_master_weights=_master_weights(c, c.lt_placement if r.fits_transform else "fused"),
        padded_positions=bool(c.estimation.padded_positions) and fitted,
        capture_dtype=c.model.capture_dtype
        or (nf4_unquantised_dtype(c.protocol, c.model.dtype) if c.model.capture_4bit else c.model.dtype),
    )


def _master_weights(c: schema.JobConfig, placement: str) -> str | None:
    """``healing.master_weights`` where it acts: low-precision weights that train."""
    trains_weights = c.healing.name == "full_model" or (c.healing.name == "lt_only" and placement == "separate")
    low_precision = c.model.dtype in ("bfloat16", "float16")
    return c.healing.master_weights if trains_weights and low_precision else None


def _by_value(value: Any) -> Any:
    """Numbers by value: integral floats become ints, so 0 and 0.0 hash alike."""
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_by_value(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _digest(data: dict) -> str:
    return content_key(data, 16)
