"""LinearPatch (docs/methods/linearpatch.md): a Hadamard-rotated channel scaling at the cut,
attached beside the block before it (``objective=linear_patch``, ``experiment=linearpatch``; with
its distillation, ``experiment=linearpatch_distill``)."""

from replaceme_exp.config import schema
from replaceme_exp.config.schema import Group, ObjectiveConfig, key, register_shape
from replaceme_exp.estimation.linear_patch import LinearPatchEstimator, channel_cosine_distance, check_hidden_size
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.models.shape import ModelShape
from replaceme_exp.selection.metrics import METRICS, SelectionMetric

# its selection: the per-sequence cosine of each channel over the tokens, across the cut; the official code
# never compares with the final block's output
METRICS.register(
    "channel_cosine",
    SelectionMetric("channel_cosine", "sequence", sequence_distance=channel_cosine_distance, last_cut=False),
)


@register_shape("objective")
@Group
class LinearPatchObjectiveConfig(ObjectiveConfig):
    """``objective=linear_patch``: the Hadamard-rotated channel scaling at the cut."""

    rotate: bool = key(True, doc="Hadamard rotation around the channel scaling (false: the diagonal patch)")


def rotation_fits(config: schema.JobConfig, shape: ModelShape) -> None:
    """The rotation has a Hadamard matrix of the model's hidden size."""
    if config.objective.rotate and shape.hidden_size is not None:
        check_hidden_size(shape.hidden_size)


register(
    Method(
        "linearpatch",
        title="LinearPatch",
        docs="linearpatch.md",
        # the diagonal patch (rotate=false) is another method's number: never averaged with the rotated one
        label=lambda job: "LinearPatch" if job.config.objective.rotate else "LinearPatch (unrotated)",
        estimators=(LinearPatchEstimator,),
        presets=("linearpatch", "linearpatch_distill"),
        check_shape=rotation_fits,
        column_docs={
            "patch_sequences": "LinearPatch, per cut: the calibration sequences whose channel ratios were averaged.",
            "patch_scale_gap": "LinearPatch, per cut: mean `|s - 1|` of its channel scales (how far magnitudes differ "
            "across the cut).",
        },
    )
)
