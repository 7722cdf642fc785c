"""ReplaceMe with a transform found by a numerical solver (the paper's cosine objective with Adam,
and its MSE, exact-cosine and elastic-net variants; ``objective=cosine`` ...,
``experiment=replaceme_cosine``): docs/methods/replaceme.md."""

from typing import Literal, Optional

from replaceme_exp.config import schema
from replaceme_exp.config.protocol import left_to_protocol, protocol_rule
from replaceme_exp.config.schema import Group, ObjectiveConfig, finite_positive, key, positive_int, register_shape
from replaceme_exp.estimation.estimators import estimator_class
from replaceme_exp.estimation.numerical import NumericalEstimator, regularizer_warning
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.methods.replaceme_ls import fitted_on


@register_shape("objective")
@Group
class NumericalObjectiveConfig(ObjectiveConfig):
    loss: Literal["cosine", "cosine_exact", "mse", "elasticnet"] = key(doc="the loss minimised over T")
    solver: Literal["adam", "lbfgs", "nlcg", "trust_ncg", "newton_cg"] = key("adam", doc="the optimiser")
    schedule: Literal["full_batch", "minibatch"] = key(
        doc="lbfgs/nlcg/trust_ncg over all tokens, or one step per batch"
    )
    lr: float = key(1.0e-4, doc="Adam's learning rate", check=finite_positive)
    batch_tokens: int = key(1024, doc="tokens per batch (adam, minibatch)", check=positive_int)
    epochs: int = key(10, doc="passes over the tokens (adam, minibatch)", check=positive_int)
    init: Literal["identity", "ls"] = key("identity", doc="start from I or from the closed form")
    max_iter: int = key(100, doc="iterations of full_batch solvers", check=positive_int)
    chunk_tokens: int = key(8192, doc="tokens per chunk of a full-batch objective", check=positive_int)
    precision: Optional[Literal["float64", "float32"]] = key(
        None,
        doc="dtype of lbfgs/nlcg/trust_ncg/newton_cg (float32: the official code's, whose steps move with the CPU's "
        "vector kernels); adam runs in float32; null: the protocol's (paper: float64; official: float32)",
    )


# The loss's name in tables.
LOSS_LABELS = {"cosine": "cosine", "cosine_exact": "cosine (exact)", "mse": "MSE", "elasticnet": "elastic net"}


def penalty_warning(config) -> dict:
    regularizer = config.regularizer.name if config.alpha else "none"
    return {"regularizer_warning": regularizer_warning(config.objective.loss, regularizer, float(config.alpha))}


register(
    Method(
        "replaceme_numerical",
        title="ReplaceMe, numerical objectives",
        docs="replaceme.md",
        label=lambda job: fitted_on(f"ReplaceMe {LOSS_LABELS[job.config.objective.loss]}", job),
        estimators=(NumericalEstimator,),
        follows_protocol=True,
        presets=("replaceme_cosine", "multi_lt_nc_cosine", "replaceme_official_cosine"),
        setting_columns={
            "regularizer_warning": "Why an L1 / L2 penalty on T with the scale-free cosine loss is ill-posed; "
            "None elsewhere.",
        },
        settings_of=penalty_warning,
    )
)


@protocol_rule("multi_lt")
def multi_lt_of_the_protocol(config: schema.JobConfig) -> dict:
    """Under ``protocol=official``, several cuts of a numerical objective one after another, each on
    the model with the earlier ones applied (cosine_dist.py reloads the pruned model for each cut);
    every other job (LS: lstsq.py fits every T from the unpruned model in one pass), and under
    ``protocol=paper``: independent."""
    if not left_to_protocol(config, "multi_lt"):
        return {}
    numerical = issubclass(estimator_class(config.objective), NumericalEstimator)
    return {"multi_lt": "sequential" if config.protocol == "official" and numerical else "independent"}


@protocol_rule("objective.precision")
def precision_of_the_protocol(config: schema.JobConfig) -> dict:
    """``objective.precision`` left to the protocol: float64 (paper), float32 (official: torchmin's
    solvers on float32 activations and a float32 T)."""
    if not left_to_protocol(config, "objective.precision"):
        return {}
    return {"objective.precision": "float32" if config.protocol == "official" else "float64"}
