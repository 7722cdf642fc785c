"""What differs between pruning a language model and a vision encoder: the calibration data, the
held-out data and how the model is evaluated before and after pruning. Selection, estimation,
surgery, held-out distances and saving are the same for both (:mod:`replaceme_exp.pipeline.job`).

A modality is registered in :data:`~replaceme_exp.pipeline.modalities.MODALITIES` under the name
:func:`~replaceme_exp.pipeline.modalities.modality_of` gives a model; :class:`Modality` is the
interface. Each checks its own settings before the model loads (:meth:`Modality.check`): the rules
ask which modality a job is once, and the modality says what it refuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from replaceme_exp.config import schema
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.models.loading import LoadedModel

if TYPE_CHECKING:  # the spec checks a job's modality through this module's registry (pipeline/rules.py)
    from replaceme_exp.pipeline.spec import JobSpec


@dataclass(frozen=True)
class JobPaths:
    """Where a job reads and writes: ``results_dir`` (rows, baselines, models), ``cache_dir``
    (converted models, statistics, generated data) and ``job_dir`` (its logs, W&B and CodeCarbon
    files), all absolute."""

    results_dir: Path
    cache_dir: Path
    job_dir: Path

    @property
    def baselines(self) -> Path:
        return self.results_dir / "baselines"

    def model_dir(self, config_hash: str) -> Path:
        return self.results_dir / "models" / config_hash

    def transforms_file(self, config_hash: str) -> Path:
        return self.results_dir / "transforms" / f"{config_hash}.safetensors"


@dataclass
class Calibration:
    """The batches a job selects its cuts on (``batches``) and fits its transforms on
    (``estimation``: the same, or with masked copies), and their row columns."""

    batches: TokenBatches
    estimation: TokenBatches
    columns: dict = field(default_factory=dict)


@dataclass(frozen=True)
class UnprunedScores:
    """The unpruned model measured: its score columns and the evaluation's settings (``columns``,
    what the row records), and its greedy ``answers`` to the generation samples' prompts (None
    without ``eval.samples``), which the pruned model's are shown beside."""

    columns: dict
    answers: list[str] | None = None


class Modality:
    """Data and evaluation of one kind of model."""

    name = "modality"

    @classmethod
    def check(cls, c: schema.JobConfig) -> None:
        """A pruning job's settings this modality refuses (one :class:`~replaceme_exp.errors.ConfigError`),
        before anything loads. The calibration source's own modality is checked by the rules."""
        cls.check_eval(c)

    @classmethod
    def check_eval(cls, c: schema.JobConfig) -> None:
        """The evaluation's settings (``eval``) this modality refuses: a pruning or an evaluate job's."""

    def __init__(self, spec: JobSpec, paths: JobPaths):
        self.spec, self.config, self.paths = spec, spec.config, paths

    def calibration(self, loaded: LoadedModel, adapter) -> Calibration:
        """The calibration batches (announces its ``data`` stage)."""
        raise NotImplementedError

    def heldout(self, loaded: LoadedModel, adapter) -> TokenBatches | None:
        """Held-out batches for the transforms' distances (None: no held-out check)."""
        raise NotImplementedError

    def evaluate_unpruned(
        self, loaded: LoadedModel, adapter, heldout, baselines: BaselineCache, device: torch.device
    ) -> UnprunedScores:
        """The unpruned model's scores (cached in ``baselines``; inputs on ``device``) and the
        evaluation's settings."""
        raise NotImplementedError

    def quality(self, loaded: LoadedModel, heldout, healed: bool = False) -> dict:
        """The held-out quality of the pruned model (``healed``: after healing), as columns."""
        return {}

    def evaluate_pruned(
        self, loaded: LoadedModel, adapter, heldout, unpruned: UnprunedScores, device: torch.device
    ) -> dict:
        """The pruned (and healed) model's scores (inputs on ``device``; beside the ``unpruned``
        model's where a column compares them), as row columns."""
        raise NotImplementedError

    def evaluate_model(self, loaded: LoadedModel, adapter) -> dict:
        """An evaluate job's model (``job=evaluate``: nothing pruned), measured as a pruning job
        measures its pruned model: the same score columns (no baseline, no ratio to one), and the
        evaluation's settings."""
        raise NotImplementedError

    def pruned_columns(self, removed: int, num_layers: int) -> dict:
        """Columns of the pruned model's depth: ``removed`` of the unpruned model's ``num_layers``
        blocks."""
        return {}
