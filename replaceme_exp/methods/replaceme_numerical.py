"""ReplaceMe with a transform found by a numerical solver (the paper's cosine objective with Adam,
and its MSE, exact-cosine and elastic-net variants; ``objective=cosine`` ...,
``experiment=replaceme_cosine``): docs/methods/replaceme.md."""

from typing import Literal, Optional

from replaceme_exp.config import schema
from replaceme_exp.config.protocol import left_to_protocol, protocol_rule
from replaceme_exp.config.schema import Group, ObjectiveConfig, finite_positive, key, positive_int, register_shape
from replaceme_exp.estimation.estimators import estimator_class
from replaceme_exp.estimation.numerical import NumericalEstimator, check_backend, regularizer_warning
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.methods.replaceme_ls import fitted_on


@register_shape("objective")
@Group
class NumericalObjectiveConfig(ObjectiveConfig):
    loss: Literal["cosine", "cosine_exact", "mse", "mse_exact", "elasticnet", "elasticnet_exact"] = key(
        doc="the loss minimised over T (*_exact: the official accurate=True form, M T + Y against L)"
    )
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
    solver_backend: Optional[Literal["scipy_torch", "torchmin"]] = key(
        None,
        doc="what runs lbfgs/nlcg/trust_ncg/newton_cg: scipy_torch (SciPy's minimize, torch.optim.LBFGS) or "
        "torchmin (the official code's minimize(..., max_iter=1) per batch; schedule=minibatch only); "
        "null: the protocol's (paper: scipy_torch; official: torchmin with schedule=minibatch)",
    )
    mse_reduction: Optional[Literal["sum_hidden", "mean"]] = key(
        None,
        doc="mse / mse_exact per token: the sum over hidden, or the mean over hidden (the official "
        "MSELoss(reduction='mean'), d times smaller; alpha keeps its ridge meaning); null: the protocol's "
        "(paper: sum_hidden; official: mean)",
    )


# The loss's name in tables.
LOSS_LABELS = {
    "cosine": "cosine",
    "cosine_exact": "cosine (exact)",
    "mse": "MSE",
    "mse_exact": "MSE (exact)",
    "elasticnet": "elastic net",
    "elasticnet_exact": "elastic net (exact)",
}


def backend_acts(objective) -> bool:
    """Whether ``objective.solver_backend`` acts: a non-Adam solver (Adam is PyTorch's either way)."""
    return objective.solver != "adam"


def mse_reduction_acts(objective) -> bool:
    return objective.loss in ("mse", "mse_exact")


def numerical_settings(config) -> dict:
    """The row's columns of this method: the penalty warning, and the solver backend and the MSE
    reduction where they act (None elsewhere)."""
    objective, regularizer = config.objective, config.regularizer.name if config.alpha else "none"
    return {
        "regularizer_warning": regularizer_warning(objective.loss, regularizer, float(config.alpha)),
        "solver_backend": objective.solver_backend if backend_acts(objective) else None,
        "mse_reduction": objective.mse_reduction if mse_reduction_acts(objective) else None,
    }


def settings_as_they_act(config, data: dict) -> None:
    """In the hashed config ``data``, the solver backend and the MSE reduction only where they act
    and differ from what ran before the keys existed (scipy_torch, sum_hidden): hashes stay."""
    objective = config.objective
    if not backend_acts(objective) or objective.solver_backend == "scipy_torch":
        data["objective"].pop("solver_backend", None)
    if not mse_reduction_acts(objective) or objective.mse_reduction == "sum_hidden":
        data["objective"].pop("mse_reduction", None)


def check_backend_schedule(config, requirements) -> None:
    objective = config.objective
    check_backend(objective.solver, objective.schedule, objective.solver_backend)


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
            "solver_backend": "What ran lbfgs / nlcg / trust_ncg / newton_cg (`objective.solver_backend`): "
            "`scipy_torch` (SciPy's minimize, torch.optim.LBFGS) or `torchmin` (the official code's "
            "`minimize(..., max_iter=1)` per batch); None for Adam and closed forms.",
            "mse_reduction": "The per-token MSE of `objective=mse` / `mse_exact` (`objective.mse_reduction`): "
            "`sum_hidden` (summed over hidden) or `mean` (the official `MSELoss(reduction='mean')`, d times "
            "smaller); None for other losses.",
        },
        settings_of=numerical_settings,
        identity=settings_as_they_act,
        check=check_backend_schedule,
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


@protocol_rule("objective.solver_backend")
def solver_backend_of_the_protocol(config: schema.JobConfig) -> dict:
    """``objective.solver_backend`` left to the protocol: torchmin under ``protocol=official`` with the
    minibatch schedule (utils.py optimizing_method: ``minimize(objective, A, method=solver,
    max_iter=1)`` per batch), else scipy_torch (this project's: SciPy's minimize, torch.optim.LBFGS)."""
    if not left_to_protocol(config, "objective.solver_backend"):
        return {}
    official = config.protocol == "official" and config.objective.schedule == "minibatch"
    return {"objective.solver_backend": "torchmin" if official else "scipy_torch"}


@protocol_rule("objective.mse_reduction")
def mse_reduction_of_the_protocol(config: schema.JobConfig) -> dict:
    """``objective.mse_reduction`` left to the protocol: mean (official: ``nn.MSELoss(reduction='mean')``,
    over tokens x hidden), else sum_hidden (paper: ``||M T - R||^2`` per token)."""
    if not left_to_protocol(config, "objective.mse_reduction"):
        return {}
    return {"objective.mse_reduction": "mean" if config.protocol == "official" else "sum_hidden"}
