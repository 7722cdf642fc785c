"""Fitting the transforms of a job's cuts: from statistics (closed forms) or from stored tokens
(numerical objectives), every transform from the unpruned model's activations."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from replaceme_exp.capture import LinearStatistics, distributed, run_capture
from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.capture.folds import linear_statistics
from replaceme_exp.capture.hooks import input_device
from replaceme_exp.capture.runner import gather
from replaceme_exp.capture.statistics import LinearStats, TokenCollector
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.config.schema import StoreConfig
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.errors import ConfigError, NonFiniteError
from replaceme_exp.estimation.estimators import Estimator, Requirements
from replaceme_exp.estimation.least_squares import residual_sq, ridge_solve
from replaceme_exp.stages import stage

Cut = tuple[int, int]


@dataclass(frozen=True)
class FitRequest:
    """How a job fits its transforms: ``alpha`` with the ``regularizer`` that acts, the
    ``structure`` of T, the ``seed`` of the solvers' batches, the statistics' ``placement``, token
    ``rule`` and ``precision``, where token stores live (``store``), whose they are (``owner``:
    the config hash, so a killed run's stores can be found and removed) and how the captures run
    (``execution``, the capture plan; None: whole-model), what the estimator fits from (``needs``)."""

    alpha: float
    regularizer: str
    structure: str
    seed: int
    placement: str
    rule: TokenRule
    precision: str
    store: StoreConfig
    owner: str = ""
    composed: frozenset = frozenset()  # cuts whose T maps the whole block output (touching_cuts=compose)
    execution: CaptureExecution | None = None
    needs: Requirements = Requirements(statistics=True)  # what the estimator declared it fits from

    def placement_of(self, cut: Cut) -> str:
        """Where ``cut``'s statistics and tokens come from: ``separate`` for a composed cut."""
        return "separate" if cut in self.composed else self.placement


@dataclass
class Fit:
    """The transform of each cut (None: T = I, nothing fused) and what the fit recorded: tokens
    per cut, training losses, loss curves, solver steps, where the token store lived."""

    transforms: dict[Cut, torch.Tensor | None]
    fit_tokens: dict[str, int] = field(default_factory=dict)
    cut_train_losses: dict[str, float] = field(default_factory=dict)
    loss_curves: dict[str, list[float]] = field(default_factory=dict)
    solver_steps: dict[str, int] = field(default_factory=dict)
    store_location: str | None = None
    alpha_effect: dict[str, float | None] = field(default_factory=dict)
    gram_mean_eigenvalue: dict[str, float] = field(default_factory=dict)
    estimator_columns: dict[str, dict] = field(default_factory=dict)  # {column: {cut label: value}}

    def columns(self) -> dict:
        """``transform_rms``: each cut's ``||T||_F / sqrt(d)`` (1 for T = I; how a penalty or a
        scale-free loss left T's scale); for a closed form fitted with ``alpha > 0``,
        ``alpha_effect`` (:func:`alpha_effect`) and ``gram_mean_eigenvalue`` (``trace(M^T M) / d``,
        the scale a token-sum alpha acts against); and what the estimator recorded per cut
        (:meth:`Estimator.columns`)."""
        out: dict = {"fit_tokens": self.fit_tokens, **self.estimator_columns}
        if self.alpha_effect:
            out.update(alpha_effect=self.alpha_effect, gram_mean_eigenvalue=self.gram_mean_eigenvalue)
        rms = {label(c): float(t.norm() / t.shape[0] ** 0.5) for c, t in self.transforms.items() if t is not None}
        if rms:
            out["transform_rms"] = rms
        if self.loss_curves:
            out.update(
                loss_curves=self.loss_curves,
                solver_steps=self.solver_steps,
                store_location=self.store_location,
                train_loss=sum(c[-1] for c in self.loss_curves.values()) / len(self.loss_curves),
            )
        elif self.cut_train_losses:
            losses = self.cut_train_losses
            out.update(cut_train_losses=losses, train_loss=sum(losses.values()) / len(losses))
        return out

    def relabelled(self, cut: Cut, original: Cut) -> "Fit":
        """This fit with the results of ``cut`` filed under ``original`` (a cut shifted by earlier
        removals in a sequential estimation)."""

        def move(d: dict) -> dict:
            return {(label(original) if k == label(cut) else k): v for k, v in d.items()}

        return Fit(
            {original if c == cut else c: t for c, t in self.transforms.items()},
            move(self.fit_tokens),
            move(self.cut_train_losses),
            move(self.loss_curves),
            move(self.solver_steps),
            self.store_location,
            move(self.alpha_effect),
            move(self.gram_mean_eigenvalue),
            {column: move(values) for column, values in self.estimator_columns.items()},
        )

    def merged(self, other: "Fit") -> "Fit":
        return Fit(
            {**self.transforms, **other.transforms},
            {**self.fit_tokens, **other.fit_tokens},
            {**self.cut_train_losses, **other.cut_train_losses},
            {**self.loss_curves, **other.loss_curves},
            {**self.solver_steps, **other.solver_steps},
            other.store_location or self.store_location,
            {**self.alpha_effect, **other.alpha_effect},
            {**self.gram_mean_eigenvalue, **other.gram_mean_eigenvalue},
            {
                column: {**self.estimator_columns.get(column, {}), **other.estimator_columns.get(column, {})}
                for column in {**self.estimator_columns, **other.estimator_columns}
            },
        )


def label(cut: Cut) -> str:
    return f"{cut[0]}-{cut[1]}"


def fit_from_tokens(
    adapter, batches: TokenBatches, estimator: Estimator, cuts: list[Cut], stats: dict, request: FitRequest
) -> Fit:
    """Numerical objectives: one capture pass fills a token store per cut (the non-padding tokens
    that the token rule keeps, bfloat16) and, for ``init=ls``, the statistics not already in
    ``stats``; then each T is fitted on its store."""
    device = input_device(adapter, request.execution)
    rule = request.rule
    stores = {
        cut: TokenStore(
            estimator.store_names(),
            batches.n_positions if rule.padded_positions else batches.n_tokens,
            adapter.hidden_size,
            device,
            location=request.store.location,
            max_gpu_gb=request.store.max_gpu_gb,
            max_cpu_gb=request.store.max_cpu_gb,
            directory=request.store.directory,
            owner=request.owner,
        )
        for cut in cuts
    }
    # An LS start point needs the statistics of its cut: gathered in the same pass when missing.
    missing = [cut for cut in cuts if estimator.init == "ls" and cut not in stats]
    extra = [
        LinearStatistics(group, adapter.hidden_size, device, where, rule, request.precision)
        for where in ("fused", "separate")
        if (group := [cut for cut in missing if request.placement_of(cut) == where])
    ]
    collectors = {cut: TokenCollector(cut, store, request.placement_of(cut), rule) for cut, store in stores.items()}
    fit = Fit({})
    try:
        with stage("capture", "capture (tokens)"):
            statistics = list(collectors.values()) + extra
            run_capture(adapter, batches, statistics, desc="capture (tokens)", execution=request.execution)
        for cut, collector in collectors.items():
            if collector.offset == 0:
                raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cut {list(cut)}")
            stores[cut].truncate(collector.offset)
            fit.fit_tokens[label(cut)] = int(collector.offset)
        if not distributed.is_leader():  # its stores hold its own tokens only: rank 0 fits
            return fit
        stats = {**stats, **{cut: s for accumulator in extra for cut, s in accumulator.result().items()}}
        with stage("estimate"):
            for cut, store in stores.items():
                init = None
                if estimator.init == "ls":
                    init = ridge_solve(stats[cut], request.alpha if request.regularizer == "l2" else 0.0)
                fit.transforms[cut], info = estimator.fit(
                    store, request.alpha, request.regularizer, request.structure, request.seed, init
                )
                fit.loss_curves[label(cut)] = info["loss_curve"]
                fit.solver_steps[label(cut)] = info["steps"]
    finally:
        for store in stores.values():
            store.close()
    fit.store_location = next(iter(stores.values())).location
    return fit


def fit_from_accumulators(
    adapter, batches: TokenBatches, estimator: Estimator, declared: dict, cache=None, execution=None
) -> Fit:
    """Each cut's T from the statistics its estimator ``declared`` (``{cut: [accumulator, ...]}``,
    :meth:`Estimator.accumulators`), gathered over ``batches`` (:func:`~replaceme_exp.capture.runner.gather`:
    from ``cache`` where it holds them, the rest in one capture pass as the capture plan ``execution`` says);
    ``fit_tokens``: the tokens each cut's first statistic accumulated over (none: refused, naming the
    calibration's sequences)."""
    accumulators = [a for found in declared.values() for a in found]
    kinds = ", ".join(sorted({a.kind.replace("_", " ") for a in accumulators}))
    gather(adapter, batches, accumulators, cache, execution, desc=f"capture ({kinds})")
    fit = Fit({})
    if not distributed.is_leader():  # every rank took its share of the capture: rank 0 fits
        return fit
    with stage("estimate"):
        for cut, found in declared.items():
            if (tokens := found[0].token_count()) == 0:
                reason = f"leaves no calibration token for cut {list(cut)}"
                raise ConfigError("calibration.n_samples", batches.n_sequences, reason)
            fit.transforms[cut] = estimator.estimate_from(cut, found)
            fit.fit_tokens[label(cut)] = tokens
    return fit


def lacking_statistics(
    adapter, batches: TokenBatches, cuts: list[Cut], stats: dict[Cut, LinearStats], request: FitRequest
) -> dict[Cut, LinearStats]:
    """``stats``, with the LS statistics of the ``cuts`` it lacks captured over ``batches`` in one pass (per
    fold where the estimator declares ``statistic_folds``): a sequential cut's, on the partly pruned model."""
    missing = [cut for cut in cuts if cut not in stats]
    if not missing or not request.needs.statistics:
        return stats
    device = input_device(adapter, request.execution)
    folds = request.needs.statistic_folds
    accumulator = linear_statistics(
        missing, adapter.hidden_size, device, request.placement, request.rule, request.precision, folds
    )
    desc = f"capture (statistics of {', '.join(str(list(cut)) for cut in missing)})"
    with stage("capture", desc):
        run_capture(adapter, batches, [accumulator], desc=desc, execution=request.execution)
    return {**stats, **accumulator.result()}


def fit_transforms(
    adapter,
    batches: TokenBatches,
    estimator: Estimator,
    cuts: list[Cut],
    stats: dict[Cut, LinearStats],
    request: FitRequest,
    cache=None,
) -> Fit:
    """T for each cut (None = identity), from the statistics the estimator declares
    (:meth:`Estimator.accumulators`, kept in ``cache`` for the model and ``batches``; None: not kept),
    from stored tokens, or from the LS statistics ``stats`` (those it lacks captured here,
    :func:`lacking_statistics`); a non-finite T fails the stage naming its cut. The estimator's own columns (:meth:`Estimator.columns`) go into the fit's."""
    device = input_device(adapter, request.execution)
    declared = {cut: found for cut in cuts if (found := estimator.accumulators(cut, adapter.hidden_size, device))}
    if declared:
        fit = fit_from_accumulators(adapter, batches, estimator, declared, cache, request.execution)
    elif request.needs.tokens:
        fit = fit_from_tokens(adapter, batches, estimator, cuts, stats, request)
    else:
        stats = lacking_statistics(adapter, batches, cuts, stats, request)
        for cut in cuts:
            if cut in stats and stats[cut].n_tokens == 0 and request.needs.statistics:
                reason = f"leaves no calibration token for cut {list(cut)}"
                raise ConfigError("estimation.tokens", request.rule.key(), reason)
        if not distributed.is_leader():  # no capture left to share: rank 0 fits
            return Fit({})
        fit = Fit({})
        if request.needs.statistics:
            fit.fit_tokens = {label(cut): stats[cut].n_tokens for cut in cuts if cut in stats}
        with stage("estimate"):
            fit.transforms = {cut: estimator.estimate(stats.get(cut), request.alpha, request.structure) for cut in cuts}
        fitted = {cut: t for cut, t in fit.transforms.items() if t is not None and cut in stats}
        # closed form: the training loss is the mean squared residual per token
        fit.cut_train_losses = {label(c): residual_sq(stats[c], t) / stats[c].n_tokens for c, t in fitted.items()}
        if request.alpha > 0 and request.structure != "orthonormal":
            for cut, transform in fitted.items():
                fit.alpha_effect[label(cut)] = alpha_effect(estimator, stats[cut], transform, request.structure)
                fit.gram_mean_eigenvalue[label(cut)] = float(stats[cut].mtm.diagonal().double().mean())
    fit.estimator_columns = {
        column: {label(cut): value for cut, value in values.items() if cut in fit.transforms}
        for column, values in estimator.columns().items()
    }
    for cut, transform in fit.transforms.items():
        if transform is not None and not torch.isfinite(transform).all():
            raise NonFiniteError("estimate", f"the transform of cut {list(cut)} is")
    return fit


def alpha_effect(estimator: Estimator, stats: LinearStats, transform: torch.Tensor, structure: str) -> float | None:
    """How much ``alpha`` moved a closed-form T, measured: ``||T(alpha) - T(0)||_F / ||T(0)||_F``
    with ``T(0)`` solved again without it (None where ``T(0)`` does not exist: a singular system,
    which only alpha makes solvable). A token-sum alpha is added to ``M^T M`` summed over every
    calibration token, so an alpha far below its mean eigenvalue changes nothing a float32 weight
    can hold (``runtime.sweep_summary`` says so)."""
    try:
        unregularised = estimator.estimate(stats, 0.0, structure)
    except ConfigError:
        return None
    unregularised = unregularised.to(torch.float64)
    norm = float(unregularised.norm())
    return float((transform.to(torch.float64) - unregularised).norm()) / norm if norm > 0 else None
