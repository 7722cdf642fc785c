"""An evaluate job (``job=evaluate``): load one model, then measure it on the eval suite; no
calibration, selection, estimation or surgery.

The model is ``model``, or ``evaluate.checkpoint`` (a pruned model this project saved, or any
checkpoint directory), which :func:`~replaceme_exp.pipeline.spec.evaluated` made the job's ``model``.
It is measured by the job's :class:`~replaceme_exp.pipeline.modality.Modality`, the code that
measures a pruning job's models, under the pruned model's column names (``ppl_heldout``,
``avg_acc``, ``acc_<task>``, ...), so a report reads both rows alike.
"""

from __future__ import annotations

from replaceme_exp.capture.hooks import input_device
from replaceme_exp.models import count_parameters, load_model
from replaceme_exp.pipeline.job import PruningJob, device_name
from replaceme_exp.pipeline.modality import MODALITIES, JobPaths
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.stages import stage
from replaceme_exp.surgery import attach_saved_transforms, replacement_parameters


class EvaluationJob:
    """An evaluate job of ``spec``, writing into ``row`` as it goes; :meth:`run` returns the row."""

    def __init__(self, spec: JobSpec, paths: JobPaths, row: dict):
        self.spec, self.config, self.paths, self.row = spec, spec.config, paths, row
        self.modality = MODALITIES.get(spec.modality)(spec, paths)

    def record(self, columns: dict) -> None:
        self.row.update(columns)

    def run(self) -> dict:
        self.load()
        self.evaluate()
        return self.row

    def load(self) -> None:
        """The model (a checkpoint's separate transforms or replacement FFN re-attached), checked finite; its depth,
        its parameters and, for a checkpoint this project saved, the cuts that made it."""
        c = self.config
        with stage("load"):
            self.loaded = load_model(c.model, self.paths.cache_dir, self.spec.weights)
            if c.evaluate.checkpoint is not None:
                attach_saved_transforms(self.loaded.model, c.model.pretrained)
            self.adapter = PruningJob.adapted(self.loaded)
        self.device = input_device(self.adapter)
        metadata = self.spec.checkpoint_metadata or {}
        self.record(
            {
                "model_revision": self.loaded.identity.get("commit"),
                "num_layers": self.adapter.num_layers,
                "params": count_parameters(self.loaded.model) + replacement_parameters(self.loaded.model),
                "device": device_name(self.device),
                "cuts": metadata.get("cuts"),
                "kept_blocks": metadata.get("kept_blocks"),
            }
        )

    def evaluate(self) -> None:
        self.record(self.modality.evaluate_model(self.loaded, self.adapter))
