"""Estimators built by ``_target_`` from the ``objective`` config group.

Each estimator declares what it needs and what it accepts (:class:`Requirements`, from its
``objective`` config, before anything loads): the job plans its captures, checks the regulariser
and the structure, and derives the job's effective settings from the declaration, never by
probing an instance."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra.utils import get_class

from replaceme_exp.capture.accumulator import Accumulator
from replaceme_exp.capture.statistics import Cut, LinearStats
from replaceme_exp.config import schema
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.least_squares import diagonal_solve, orthonormal_solve, ridge_solve
from replaceme_exp.plugins import plugin_packages

# The structures with a closed form (objective=ls), the default; the numerical objectives:
# replaceme_exp.estimation.numerical.STRUCTURES (rank1 and lower_triangular have none here).
STRUCTURES = ("generic", "diagonal", "orthonormal")


@dataclass(frozen=True)
class Requirements:
    """What an estimator needs from a job and what it accepts.

    ``statistics``: the LS statistics (``M^T M``, ``M^T R``) of its cuts; ``tokens``: a token store
    of per-token activations (numerical objectives); any other statistic an estimator declares
    itself (:meth:`Estimator.accumulators`); ``fits_transform``: it returns a T
    (``healing=lt_only`` trains it; False: the blocks are removed, nothing fused); ``uses_alpha``:
    ``alpha`` regularises it, on the scale ``alpha_scale`` ("token_sum": added to statistics summed
    over tokens, ridge ``(M^T M + alpha I)^{-1} M^T R``, the official code's convention;
    "token_mean": added to the mean per-token loss, the paper's cosine alphas); ``regularizers`` and
    ``structures``: what it can apply (``structures_without_alpha``: those whose solution ``alpha``
    does not change); ``placements``: the ``lt_placement`` values it applies in; ``solver`` /
    ``solver_schedule``: the solver and the schedule it really runs (None for closed forms);
    ``solver_precision``: the dtype its solver computes T in (None for closed forms);
    ``statistic_folds``: the statistics wanted per fold of whole calibration sequences
    (:class:`~replaceme_exp.capture.folds.FoldedStats`; 0: all tokens); ``replacement``: a trained
    network replaces the cut instead of a T (LLM-Streamline: ``"ffn"``, a new FFN after the block before the cut;
    ``"layer"``, the cut's first block retrained, so its selected cut spans one block more than it
    removes); ``beside_weights``: what it trains rides beside the checkpoint's weights (a saved model
    is no plain checkpoint); ``extra_blocks``: how many blocks more than it removes its selected cut
    spans; ``width_determined``: the structures whose unregularised fit needs at least as many
    calibration tokens as the model is wide (a hidden x hidden system)."""

    statistics: bool
    tokens: bool = False
    fits_transform: bool = True
    uses_alpha: bool = True
    alpha_scale: str | None = "token_sum"
    regularizers: tuple[str, ...] = ("none", "l2")
    structures: tuple[str, ...] = STRUCTURES
    structures_without_alpha: tuple[str, ...] = ()
    placements: tuple[str, ...] = ("fused", "separate")
    solver: str | None = None
    solver_schedule: str | None = None
    solver_precision: str | None = None
    replacement: str | None = None
    statistic_folds: int = 0  # >= 2: the statistics kept per fold of whole sequences (capture.folds)
    beside_weights: bool = False  # a trained module rides beside the checkpoint's weights (not a plain one)
    extra_blocks: int = 0  # its selected cut spans this many blocks more than it removes
    width_determined: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        """Whether anything is fitted from calibration activations."""
        return self.statistics or self.tokens

    def columns(self) -> dict[str, str | None]:
        """The row's columns of what it runs: ``solver``, ``solver_schedule``, ``solver_precision`` (None for
        closed forms) and ``alpha_scale`` (None where ``alpha`` does not act on it)."""
        return {
            "solver": self.solver,
            "solver_schedule": self.solver_schedule,
            "solver_precision": self.solver_precision,
            "alpha_scale": self.alpha_scale if self.uses_alpha else None,
        }

    def check(self, c: schema.JobConfig) -> None:
        """The settings that act on this estimator (``regularizer``, ``alpha``, ``structure``,
        ``lt_placement``) against what it accepts, before anything loads: one :class:`ConfigError`."""
        name = c.objective.name
        if self.uses_alpha:
            if c.regularizer.name == "none" and c.alpha > 0:
                raise ConfigError("alpha", c.alpha, "has no effect with regularizer=none; use regularizer=l2 (ridge)")
            if c.regularizer.name not in self.regularizers:
                reason = f"objective={name} supports {', '.join(self.regularizers)}"
                raise ConfigError("regularizer", c.regularizer.name, reason)
        if self.fits_transform and c.structure.name not in self.structures:
            reason = f"objective={name} supports {' or '.join(self.structures)}"
            raise ConfigError("structure", c.structure.name, reason)
        if self.fits_transform and c.lt_placement not in self.placements:
            reason = f"objective={name} is applied with lt_placement={' or '.join(self.placements)}"
            raise ConfigError("lt_placement", c.lt_placement, reason)
        if self.uses_alpha and c.alpha != 0 and c.structure.name in self.structures_without_alpha:
            reason = f"has no effect with structure={c.structure.name} and objective={name}"
            raise ConfigError("alpha", c.alpha, reason + " (its solution ignores alpha); use alpha=0")


class Estimator:
    """Maps a cut's statistics to its transform T, (hidden, hidden) float64, or None for T = I
    with nothing fused."""

    name: str = "estimator"

    @classmethod
    def requirements(cls, objective) -> Requirements:
        """What this estimator needs and accepts under the ``objective`` config (typed)."""
        return Requirements(statistics=True)

    def estimate(self, stats: LinearStats | None, alpha: float, structure: str = "generic") -> torch.Tensor | None:
        raise NotImplementedError

    def accumulators(self, cut: Cut, hidden_size: int, device: torch.device) -> list[Accumulator]:
        """The statistics of ``cut`` it fits from, beyond the LS statistics and the token store (none by
        default): the capture fills them, over the estimation batches, kept in the statistics cache
        (:func:`~replaceme_exp.capture.runner.gather`), and :meth:`estimate_from` reads them."""
        return []

    def estimate_from(self, cut: Cut, accumulators: list[Accumulator]) -> torch.Tensor | None:
        """T of ``cut`` from the :meth:`accumulators` it declared, filled."""
        raise NotImplementedError

    def columns(self) -> dict[str, dict]:
        """Row columns of what the estimates found, each ``{column: {cut: value}}`` (none by default)."""
        return {}


class LeastSquaresEstimator(Estimator):
    """Closed-form LS (ReplaceMe's L2 objective); ridge when ``alpha > 0``. ``structure``:
    ``generic`` (full matrix), ``diagonal`` (per-coordinate scaling) or ``orthonormal``
    (Procrustes), each the exact minimiser within its class."""

    name = "ls"

    def __init__(self, name: str = "ls", max_condition: float = 1e13):
        self.name, self.max_condition = name, max_condition

    @classmethod
    def requirements(cls, objective) -> Requirements:
        # Procrustes: every orthonormal T has the same norm, so a ridge term changes no solution.
        return Requirements(statistics=True, structures_without_alpha=("orthonormal",), width_determined=("generic",))

    def estimate(self, stats: LinearStats | None, alpha: float, structure: str = "generic") -> torch.Tensor:
        if structure == "diagonal":
            return diagonal_solve(stats, alpha)
        if structure == "orthonormal":
            return orthonormal_solve(stats)
        if structure != "generic":
            raise ConfigError("structure", structure, f"choose one of {STRUCTURES}")
        return ridge_solve(stats, alpha=alpha, max_condition=self.max_condition)


class IdentityEstimator(Estimator):
    """T = I: the blocks are removed and nothing is fused (the UIDL baseline without healing)."""

    name = "identity"

    def __init__(self, name: str = "identity"):
        self.name = name

    @classmethod
    def requirements(cls, objective) -> Requirements:
        return Requirements(
            statistics=False, fits_transform=False, uses_alpha=False, alpha_scale=None, regularizers=("none",)
        )

    def estimate(self, stats: LinearStats | None, alpha: float, structure: str = "generic") -> None:
        return None


# ``objective._target_`` is imported and instantiated: only the project's own modules and those of the
# installed plugins may be named (a shared sweep file or template must not run arbitrary code); an
# estimator of one's own goes under replaceme_exp/estimation/ or in a plugin (docs/extending/estimator.md).
ALLOWED_TARGET_PREFIXES = ("replaceme_exp.",)


def estimator_class(objective: schema.ObjectiveConfig) -> type[Estimator]:
    """The estimator class ``objective._target_`` names, one of the project's own."""
    target = objective._target_
    allowed = ALLOWED_TARGET_PREFIXES + tuple(f"{package}." for package in plugin_packages())
    if not (isinstance(target, str) and target.startswith(allowed)):
        packages = ", ".join(p + "*" for p in allowed)
        reason = f"only the project's estimator classes and its plugins' ({packages}) are instantiated"
        raise ConfigError("objective._target_", target, reason)
    try:
        found = get_class(objective._target_)
    except Exception as err:  # noqa: BLE001 - hydra raises several types for an unknown path
        raise ConfigError("objective._target_", objective._target_, f"no such estimator class ({err})") from err
    if not (isinstance(found, type) and issubclass(found, Estimator)):
        raise ConfigError("objective._target_", objective._target_, "is not an Estimator")
    return found
