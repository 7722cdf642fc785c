"""Fitting the transforms of a job's cuts: from statistics (closed forms), from stored tokens
(numerical objectives), independently or one cut after another on the partly pruned model."""

from __future__ import annotations

import torch

from replaceme_exp.capture import LinearStatistics, TransformDistances, run_capture
from replaceme_exp.capture.execution import capture_precision
from replaceme_exp.capture.runner import input_device
from replaceme_exp.capture.statistics import TokenCollector, split_columns
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.errors import ConfigError, NonFiniteError
from replaceme_exp.estimation.least_squares import residual_sq, ridge_solve
from replaceme_exp.surgery import prune


def fit_token_counts(row: dict, counts: dict) -> None:
    """Record how many tokens entered each cut's fit (``fit_tokens``, by ``"start-end"``)."""
    row.setdefault("fit_tokens", {}).update({f"{c[0]}-{c[1]}": int(n) for c, n in counts.items()})


def estimate_from_tokens(cfg, adapter, calibration, estimator, cuts, stats, row, timer) -> dict:
    """Numerical objectives: one capture pass fills a token store per cut (the non-padding
    tokens that ``estimation.tokens`` keeps, bfloat16) and, for ``init=ls``, the statistics not
    already in ``stats``; then each T is fitted on its store. Every transform is estimated from
    the unpruned model's activations. Records the solver, the final training loss (mean over
    cuts) and each cut's per-epoch loss curve."""
    device = input_device(adapter)
    rule = TokenRule.from_config(cfg.get("estimation"))
    stores = {
        cut: TokenStore(
            estimator.store_names(),
            calibration.n_tokens,
            adapter.hidden_size,
            device,
            location=cfg.store.location,
            max_gpu_gb=cfg.store.max_gpu_gb,
            max_cpu_gb=cfg.store.max_cpu_gb,
            directory=cfg.store.directory,
            owner=row.get("config_hash", ""),
        )
        for cut in cuts
    }
    # An LS start point needs the statistics of its cut: gathered in the same pass when missing.
    missing = [cut for cut in cuts if estimator.init == "ls" and cut not in stats]
    precision = capture_precision(cfg)
    extra = (
        [LinearStatistics(missing, adapter.hidden_size, device, cfg.lt_placement, rule, precision)] if missing else []
    )
    collectors = {cut: TokenCollector(cut, store, cfg.lt_placement, rule) for cut, store in stores.items()}
    try:
        with timer("capture", "capture (tokens)"):
            run_capture(
                adapter,
                calibration,
                list(collectors.values()) + extra,
                desc="capture (tokens)",
            )
        for cut, collector in collectors.items():
            if collector.offset == 0:
                raise ConfigError("estimation.tokens", rule.key(), f"leaves no calibration token for cut {list(cut)}")
            stores[cut].truncate(collector.offset)
        fit_token_counts(row, {cut: collector.offset for cut, collector in collectors.items()})
        stats = {**stats, **(extra[0].result() if extra else {})}
        transforms, curves, steps = {}, {}, {}
        with timer("estimate"):
            for cut, store in stores.items():
                init = None
                if estimator.init == "ls":
                    init = ridge_solve(stats[cut], float(cfg.alpha) if cfg.regularizer.name == "l2" else 0.0)
                transforms[cut], info = estimator.fit(
                    store,
                    float(cfg.alpha),
                    row["regularizer"],
                    cfg.structure.name,
                    int(cfg.seed),
                    init,
                )
                curves[f"{cut[0]}-{cut[1]}"] = info["loss_curve"]
                steps[f"{cut[0]}-{cut[1]}"] = info["steps"]
    finally:
        for store in stores.values():
            store.close()
    row["solver"] = estimator.solver
    row["solver_schedule"] = "minibatch" if estimator.solver == "adam" else estimator.schedule
    row.setdefault("solver_steps", {}).update(steps)
    row["store_location"] = next(iter(stores.values())).location
    row.setdefault("loss_curves", {}).update(curves)
    row["train_loss"] = sum(c[-1] for c in row["loss_curves"].values()) / len(row["loss_curves"])
    return transforms


def estimate(cfg, adapter, calibration, estimator, cuts, stats, row, timer) -> dict:
    """T for each cut (None = identity), from statistics or from stored tokens."""
    if getattr(estimator, "needs_tokens", False):
        transforms = estimate_from_tokens(cfg, adapter, calibration, estimator, cuts, stats, row, timer)
    else:
        for cut in cuts:
            if cut in stats and stats[cut].n_tokens == 0 and estimator.needs_statistics:
                rule = TokenRule.from_config(cfg.get("estimation")).key()
                raise ConfigError("estimation.tokens", rule, f"leaves no calibration token for cut {list(cut)}")
        fit_token_counts(row, {cut: stats[cut].n_tokens for cut in cuts if cut in stats and estimator.needs_statistics})
        with timer("estimate"):
            transforms = {cut: estimator.estimate(stats.get(cut), float(cfg.alpha), cfg.structure.name) for cut in cuts}
        fitted = {cut: t for cut, t in transforms.items() if t is not None and cut in stats}
        if fitted:  # closed form: the training loss is the mean squared residual per token
            losses = row.setdefault("cut_train_losses", {})
            losses.update({f"{c[0]}-{c[1]}": residual_sq(stats[c], t) / stats[c].n_tokens for c, t in fitted.items()})
            row["train_loss"] = sum(losses.values()) / len(losses)
    for cut, transform in transforms.items():
        if transform is not None and not torch.isfinite(transform).all():
            raise NonFiniteError("estimate", f"the transform of cut {list(cut)} is")
    return transforms


def estimate_sequentially(cfg, adapter, calibration, windows, estimator, cuts, stats, row, timer):
    """``multi_lt=sequential``: cuts in ascending order, each estimated on the model in which the
    earlier cuts are already applied (fused and removed), then applied itself. The held-out
    check of each transform is made in the same context. Prunes the model in place.

    Returns (transforms by original cut, (cos_dist_before, cos_dist_after) token-weighted over
    the stages, the sink/rest split columns of :func:`split_columns` over the stages).
    """
    rule = TokenRule.from_config(cfg.get("estimation"))
    transforms, removed, checks = {}, 0, []
    sums, total = [0.0, 0.0], 0
    for cut in cuts:
        shifted = (cut[0] - removed, cut[1] - removed)
        stage_stats = {}
        if estimator.needs_statistics and not getattr(estimator, "needs_tokens", False):
            if removed == 0 and cut in stats:
                stage_stats = {shifted: stats[cut]}
            else:
                device, precision = input_device(adapter), capture_precision(cfg)
                accumulator = LinearStatistics(
                    [shifted], adapter.hidden_size, device, cfg.lt_placement, rule, precision
                )
                with timer("capture", f"capture (stage {list(cut)})"):
                    run_capture(adapter, calibration, [accumulator], desc=f"capture (stage {list(cut)})")
                stage_stats = accumulator.result()
        transform = estimate(cfg, adapter, calibration, estimator, [shifted], stage_stats, row, timer)[shifted]
        for column in ("cut_train_losses", "loss_curves", "fit_tokens"):  # label per-cut results by the original cut
            if shifted != cut and f"{shifted[0]}-{shifted[1]}" in row.get(column, {}):
                row[column][f"{cut[0]}-{cut[1]}"] = row[column].pop(f"{shifted[0]}-{shifted[1]}")
        with timer("eval", "held-out distances"):
            check = TransformDistances({shifted: transform}, cfg.lt_placement, rule.massive_threshold)
            run_capture(adapter, windows, [check], desc="held-out distances")
        checks.append(check)
        n = sum(check.counts.values())
        before, after = check.result()
        sums, total = [sums[0] + before * n, sums[1] + after * n], total + n
        with timer("surgery"):
            prune(adapter, [shifted], {shifted: transform}, cfg.lt_placement)
        transforms[cut] = transform
        removed += cut[1] - cut[0]
    return transforms, (sums[0] / total, sums[1] / total), split_columns(checks)
