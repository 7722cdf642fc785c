"""ReplaceMe with a transform found by a numerical solver (the paper's cosine objective with Adam,
and its MSE, exact-cosine and elastic-net variants; ``objective=cosine`` ...,
``experiment=replaceme_cosine``): docs/methods/replaceme.md."""

from replaceme_exp.config import schema
from replaceme_exp.config.protocol import left_to_protocol, protocol_rule
from replaceme_exp.estimation.estimators import estimator_class
from replaceme_exp.estimation.numerical import NumericalEstimator
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.methods.replaceme_ls import fitted_on

# The loss's name in tables.
LOSS_LABELS = {"cosine": "cosine", "cosine_exact": "cosine (exact)", "mse": "MSE", "elasticnet": "elastic net"}

register(
    Method(
        "replaceme_numerical",
        docs="replaceme.md",
        label=lambda job: fitted_on(f"ReplaceMe {LOSS_LABELS[job.config.objective.loss]}", job),
        estimators=(NumericalEstimator,),
        follows_protocol=True,
        presets=("replaceme_cosine", "multi_lt_nc_cosine", "replaceme_official_cosine"),
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
