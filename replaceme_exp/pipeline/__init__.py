"""The pipeline: what a job is (:mod:`.spec`, checked by :mod:`.rules`), the stages it runs
(:mod:`.job`; an evaluate job's, :mod:`.evaluate`) and what differs between language models and
vision encoders (:mod:`.modality`, :mod:`.text`, :mod:`.vision`)."""

from replaceme_exp.config.store import register_schemas
from replaceme_exp.pipeline import text, vision  # noqa: F401  (register the modalities)
from replaceme_exp.pipeline.run import run_job
from replaceme_exp.pipeline.spec import JobSpec

# Every stage package is imported (their registries are full): the schema goes to Hydra's ConfigStore.
register_schemas()

__all__ = ["JobSpec", "run_job"]
