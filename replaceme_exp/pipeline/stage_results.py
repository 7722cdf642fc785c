"""What each stage of a pruning job (:class:`~replaceme_exp.pipeline.job.PruningJob`) returns: built
once by its stage, never changed after, and handed to the later stages that need it as an argument.
``columns`` is what the job's row records of a result; the job adds it to the row as the result
arrives, so a failure later keeps it. (A stage whose whole result is row columns returns the dict.)

The models a result holds are changed in place by later stages: the surgery prunes the evaluated
model, healing trains it.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.estimation.estimators import Estimator
from replaceme_exp.estimation.fitting import Fit
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.evaluation.heldout import HeldoutDistances
from replaceme_exp.healing import TeacherTargets
from replaceme_exp.models.adapters import DecoderAdapter
from replaceme_exp.models.loading import LoadedModel
from replaceme_exp.pipeline.modality import UnprunedScores
from replaceme_exp.selection.passes import Selection
from replaceme_exp.selection.search_steps import SearchSteps


@dataclass(frozen=True)
class CapturePlan:
    """How the captures run: ``execution`` (whole-model or layer-wise, the statistics budget, the
    last block's state; with ``model.capture_4bit`` whole-model on the 4-bit copy, the default
    budget), its ``mode`` and the one-line ``reason`` for it."""

    execution: CaptureExecution
    mode: str
    reason: str
    world_size: int = 1  # processes the calibration captures were split over
    timeout_s: float | None = None  # their collectives' timeout (None: one process)

    @property
    def columns(self) -> dict:
        return {
            "capture_mode": self.mode,
            "capture_plan": self.reason,
            "world_size": self.world_size,
            "capture_timeout_s": self.timeout_s,
        }


@dataclass(frozen=True)
class Loaded:
    """The model the captures run on: ``loaded`` (the module, its tokenizer or processor and its
    identity), its ``adapter`` and ``execution``, the capture plan its captures run under (None:
    an evaluate job's, which captures nothing)."""

    loaded: LoadedModel
    adapter: DecoderAdapter
    execution: CaptureExecution | None

    @property
    def columns(self) -> dict:
        return {"model_revision": self.loaded.identity.get("commit")}


@dataclass(frozen=True)
class Calibrated:
    """The calibration data: ``batches`` (what selection captures) and ``estimation`` (what the
    transforms are fitted on: the same, or with masked copies), the statistics ``cache`` keyed by
    the model and ``batches``, ``stats_cache`` keyed by the estimation data (the same cache when
    those are the batches and their padding does not count), the greedy searches' finished
    ``search_steps`` and the modality's ``data_columns`` (token counts)."""

    batches: TokenBatches
    estimation: TokenBatches
    cache: StatisticsCache
    stats_cache: StatisticsCache
    search_steps: SearchSteps
    data_columns: dict = field(default_factory=dict)

    @property
    def columns(self) -> dict:
        return self.data_columns


@dataclass(frozen=True)
class Selected:
    """The selection: ``selection`` (the cuts, every candidate's distance and the chosen cuts' LS
    statistics), whether the transforms are estimated one cut after another on the partly pruned
    model (``sequential``: in the prune stage, not the estimate stage) and, with
    ``record_layer_distances``, the (num_layers, num_layers) mean cosine distances between block
    outputs found in the cache or gathered by the selection pass (``layer_distances``; None when
    neither had them: the layer-distance stage records them)."""

    selection: Selection
    sequential: bool
    layer_distances: list[list[float]] | None = None

    @property
    def columns(self) -> dict:
        cuts, distances = self.selection.cuts, self.selection.distances
        out = {"cuts": [list(cut) for cut in cuts], "num_lts": len(cuts), "n_prune": removed_blocks(cuts)}
        out.update(self.selection.columns)
        if distances is not None:
            chosen = [distances[cut] for cut in cuts if cut in distances]
            out["candidate_distances"] = [[s, e, distances[(s, e)]] for s, e in sorted(distances)]
            out["selection_distance"] = float(min(chosen)) if chosen else None
        return out


@dataclass(frozen=True)
class Estimated:
    """The estimate: the ``estimator``, the ``fit`` (each cut's T, (hidden, hidden), None for T = I;
    empty for sequential cuts, fitted in the prune stage, and for a trained replacement), the
    ``selection`` the surgery applies (the selected one, or a replacement's cuts and retrained
    block's weights), the replacement ``networks`` (by the original index of the block each
    follows) and the row's ``columns`` of the estimate (the fit's, or the replacement's)."""

    estimator: Estimator
    fit: Fit
    selection: Selection
    networks: dict[int, nn.Module] = field(default_factory=dict)
    columns: dict = field(default_factory=dict)

    @property
    def replaces_linearly(self) -> bool:
        """Whether each cut is replaced by its T alone (or nothing), the blocks before it unchanged,
        so the held-out distances between ``L_{start-1}`` and ``L_{end-1}`` describe the pruned model:
        not after a search that merged weights into kept blocks, nor for a cut from block 0 (no
        ``L_{-1}`` is captured), nor where a trained network replaces the cut."""
        linear = not self.selection.block_states and not self.networks
        return linear and all(start >= 1 for start, _ in self.selection.cuts)


@dataclass(frozen=True)
class Evaluated:
    """The model that is evaluated and pruned (the captured one, or a fresh load in ``model.dtype``):
    ``loaded``, its ``adapter``, ``execution`` (the capture plan of captures on it: the job's plan
    when it is the captured model, else a whole-model one), ``device`` (where its inputs go), and before pruning
    its depth (``num_layers``), parameters (``params_before``) and resident bytes
    (``unpruned_bytes``, what a copy for the speed comparison needs)."""

    loaded: LoadedModel
    adapter: DecoderAdapter
    execution: CaptureExecution | None
    device: torch.device
    num_layers: int
    params_before: int
    unpruned_bytes: int

    @property
    def columns(self) -> dict:
        return {"num_layers": self.num_layers, "device": device_name(self.device), "params_before": self.params_before}


@dataclass(frozen=True)
class Baselines:
    """The unpruned model measured: the ``heldout`` batches of the held-out checks (None: none),
    the ``cache`` of unpruned scores and held-out distances without T (per model and evaluation),
    and the ``unpruned`` model's scores."""

    heldout: TokenBatches | None
    cache: BaselineCache
    unpruned: UnprunedScores

    @property
    def columns(self) -> dict:
        return self.unpruned.columns


@dataclass(frozen=True)
class Distillation:
    """``healing.loss=topk_kl``: the healing ``windows`` and the unpruned model's top-k next-token
    distribution on them (``targets``), taken before surgery; both None for another healing."""

    windows: TokenBatches | None = None
    targets: TeacherTargets | None = None

    @property
    def columns(self) -> dict:
        return {} if self.targets is None else {"healing_teacher_gb": self.targets.nbytes / 2**30}


@dataclass(frozen=True)
class Pruned:
    """The surgery done: the ``kept`` blocks (original indices), the ``fit`` the pruned model
    carries (the estimate's, or sequential cuts' fitted one after another), the fusion targets'
    weights before any T was fused (``unfused``, by block: what ``lt_only`` trains T against), the
    held-out checks of sequential cuts (None otherwise: checked before surgery), which caches the
    job found entries in (``cached_stages``), the parameters after (``params_after``: a separate T
    and a replacement network count) and before, and the modality's ``modality_columns``."""

    kept: list[int]
    fit: Fit
    unfused: dict
    sequential_checks: HeldoutDistances | None
    cached_stages: list[str]
    params_after: int
    params_before: int
    modality_columns: dict = field(default_factory=dict)

    @property
    def columns(self) -> dict:
        out = {}
        if self.sequential_checks is not None:
            out.update(self.fit.columns())
            out.update(self.sequential_checks.columns())
        out["cached_stages"] = self.cached_stages
        out.update(params_after=self.params_after, kept_blocks=self.kept)
        out["compression_ratio"] = 1.0 - self.params_after / self.params_before
        return {**out, **self.modality_columns}


@dataclass(frozen=True)
class HealingData:
    """What healing trains on: the ``windows`` and (``loss=topk_kl``) the teacher's ``targets``."""

    windows: TokenBatches
    targets: TeacherTargets | None = None

    @property
    def columns(self) -> dict:
        return {"healing_windows": self.windows.n_sequences}


@dataclass(frozen=True)
class SavedFile:
    """A file or directory the job wrote (``path``) and the row column that names it (``column``)."""

    column: str
    path: Path

    @property
    def columns(self) -> dict:
        return {self.column: str(self.path)}


def removed_blocks(cuts) -> int:
    """How many blocks ``cuts`` remove."""
    return sum(end - start for start, end in cuts)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
