"""LinearPatch (docs/methods/linearpatch.md): a Hadamard-rotated channel scaling at the cut,
attached beside the block before it (``objective=linear_patch``, ``experiment=linearpatch``; with
its distillation, ``experiment=linearpatch_distill``)."""

from replaceme_exp.estimation.linear_patch import LinearPatchEstimator
from replaceme_exp.methods.plugin import Method, register

register(
    Method(
        "linearpatch",
        docs="linearpatch.md",
        # the diagonal patch (rotate=false) is another method's number: never averaged with the rotated one
        label=lambda job: "LinearPatch" if job.config.objective.rotate else "LinearPatch (unrotated)",
        estimators=(LinearPatchEstimator,),
        presets=("linearpatch", "linearpatch_distill"),
    )
)
