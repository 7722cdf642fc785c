"""ReplaceMe with the closed-form least-squares transform (the paper's LS; ``objective=ls``,
``experiment=replaceme_ls``): each cut replaced by the T that minimises ``||M T - (L - Y)||^2`` over
the calibration tokens, fused into the down-projection before the cut (docs/methods/replaceme.md)."""

from replaceme_exp.config.schema import Group, ObjectiveConfig, finite_positive, key, register_shape
from replaceme_exp.estimation.estimators import LeastSquaresEstimator
from replaceme_exp.methods.plugin import Labelled, Method, register


@register_shape("objective")
@Group
class LeastSquaresObjectiveConfig(ObjectiveConfig):
    max_condition: float = key(1.0e13, doc="refuse M^T M above this condition number", check=finite_positive)


def fitted_on(name: str, job: Labelled) -> str:
    """``name``, and the search whose removed blocks the transform replaces (``... on ShortGPT cuts``)."""
    return f"{name} on {job.search.search_label} cuts" if job.search is not None else name


register(
    Method(
        "replaceme_ls",
        title="ReplaceMe LS",
        docs="replaceme.md",
        label=lambda job: fitted_on("ReplaceMe LS", job),
        estimators=(LeastSquaresEstimator,),
        follows_protocol=True,
        presets=(
            "replaceme_ls",
            "replaceme_ls_sink_aware",
            "replaceme_ls_shortgpt_cuts",
            "multi_lt_nc_ls",
            "replaceme_official",
        ),
    )
)
