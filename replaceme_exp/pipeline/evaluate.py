"""An evaluate job (``job=evaluate``): load one model, then measure it on the eval suite; no
calibration, selection, estimation or surgery.

The model is ``model``, or ``evaluate.checkpoint`` (a pruned model this project saved, or any
checkpoint directory), which :func:`~replaceme_exp.pipeline.spec.evaluated` made the job's ``model``.
It is measured by the job's :class:`~replaceme_exp.pipeline.modality.Modality`, the code that
measures a pruning job's models, under the pruned model's column names (``ppl_heldout``,
``avg_acc``, ``acc_<task>``, ...), so a report reads both rows alike.
"""

from __future__ import annotations

import torch

from replaceme_exp.capture.hooks import input_device
from replaceme_exp.models import count_parameters, load_model
from replaceme_exp.pipeline.job import PruningJob
from replaceme_exp.pipeline.modalities import MODALITIES
from replaceme_exp.pipeline.modality import JobPaths
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.pipeline.stage_results import Loaded, device_name
from replaceme_exp.stages import stage
from replaceme_exp.surgery import attach_saved_transforms, replacement_parameters


class EvaluationJob:
    """An evaluate job of ``spec``; :meth:`run` fills its row."""

    def __init__(self, spec: JobSpec, paths: JobPaths):
        self.spec, self.config, self.paths = spec, spec.config, paths
        self.modality = MODALITIES.get(spec.modality)(spec, paths)

    def run(self, row: dict) -> torch.device:
        """The model loaded, then measured; the columns of each go into ``row`` as they arrive.
        Returns the device the model's inputs go to (where the job's peak memory is read)."""
        model = self.load()
        device = input_device(model.adapter)
        row.update(self.model_columns(model, device))
        row.update(self.modality.evaluate_model(model.loaded, model.adapter))
        row["eval_quantisation"] = None  # scored as loaded, as a pruning job scores its pruned model
        return device

    def load(self) -> Loaded:
        """The model (a checkpoint's separate transforms or replacement FFN re-attached), checked finite."""
        c = self.config
        with stage("load"):
            loaded = load_model(c.model, self.paths.cache_dir, self.spec.weights)
            if c.evaluate.checkpoint is not None:
                attach_saved_transforms(loaded.model, c.model.pretrained)
            return Loaded(loaded, PruningJob.adapted(loaded), None)

    def model_columns(self, model: Loaded, device: torch.device) -> dict:
        """The model's revision, depth, parameters and device and, for a checkpoint this project
        saved, the cuts that made it."""
        metadata = self.spec.checkpoint_metadata or {}
        loaded = model.loaded
        return {
            "model_revision": loaded.identity.get("commit"),
            "num_layers": model.adapter.num_layers,
            "params": count_parameters(loaded.model) + replacement_parameters(loaded.model),
            "device": device_name(device),
            "cuts": metadata.get("cuts"),
            "kept_blocks": metadata.get("kept_blocks"),
        }
