"""What a job computes, independent of how it was spelled: the config hash and the setting hash.

Equivalent spellings hash equal: ``alpha=0``, ``alpha=0.0`` and the default; a preset and its
expansion (``experiment=uidl_baseline`` vs ``objective=identity selection=uidl``); ``regularizer=none``
vs ``l2`` at alpha 0. The hash is taken over the *effective* settings:

- keys that change where or how a job runs, not what it computes, are left out (``results_dir``,
  ``cache_dir``, ``save_model``, ``force``, ``capture`` except its precision when float32, ``store``,
  ``tracking``, ``progress``, ``model.device``, ``model.device_map``, ``eval.samples``,
  ``healing.log_every``, ``healing.gradient_checkpointing``);
- numbers hash by value (``0`` == ``0.0``);
- settings that cannot act are dropped: the regulariser and alpha when the objective takes no
  alpha or alpha is 0; the structure and placement of ``identity``; selection when ``cuts`` are
  explicit; merging and ``multi_lt`` for a single selected cut; masking keys when ``mask_ratio`` is 0;
  solver settings of closed forms; ``estimation.first`` unless ``estimation.tokens=skip_first``, and
  the token rule when nothing is fitted (the threshold stays: it splits the held-out distances);
- local data files (``calibration.path``, ``eval.path``, ``healing.data.path``) and the model's weights enter by content
  (:mod:`replaceme_exp.models.fingerprint`), and
  ``SEMANTICS_VERSION`` is bumped whenever the code changes what a configuration computes.

``setting_hash`` is the same without the seed: rows with one setting hash differ only in the seed,
the only runs a table cell may average.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.capture.execution import capture_precision
from replaceme_exp.models.fingerprint import file_digest

# Bump when the code changes what an unchanged configuration computes.
SEMANTICS_VERSION = 3
NON_SEMANTIC_KEYS = (
    "results_dir",
    "cache_dir",
    "save_model",
    "force",
    "capture",
    "store",
    "tracking",
    "progress",
    "hydra",
)
NON_SEMANTIC_MODEL_KEYS = ("device", "device_map")
SEED_KEYS = ("seed",)


def _by_value(value: Any) -> Any:
    """Numbers by value: integral floats become ints, so 0 and 0.0 hash alike."""
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_by_value(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _estimator_class(objective: dict):
    try:
        return get_class(objective["_target_"])
    except Exception:  # noqa: BLE001 - an unknown target fails clearly when the job instantiates it
        return None


def effective_settings(cfg: DictConfig, weights: dict | None = None) -> dict:
    """The resolved config reduced to what moves a number (see the module docstring)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in NON_SEMANTIC_KEYS:
        data.pop(key, None)
    model = data.get("model") or {}
    for key in NON_SEMANTIC_MODEL_KEYS:
        model.pop(key, None)
    if weights is not None:
        model["weights"] = weights
    (data.get("eval") or {}).pop("samples", None)  # what the job shows, not what it measures
    objective = data.get("objective") or {}
    estimator = _estimator_class(objective) if "_target_" in objective else None
    uses_alpha = getattr(estimator, "uses_alpha", True)
    is_identity = estimator is not None and not getattr(estimator, "needs_statistics", True) and not uses_alpha
    alpha = float(data.get("alpha") or 0)
    if not uses_alpha or alpha == 0:
        data["alpha"] = 0
        data["regularizer"] = {"name": "none"}
    selection = data.get("selection") or {}
    selects_by_ls = data.get("cuts") is None and selection.get("metric") == "ls_residual"
    if selects_by_ls:  # the selection itself solves ridge LS in the chosen placement
        data["alpha"] = alpha
    if is_identity:
        data["structure"] = {"name": "generic"}
        if not selects_by_ls:
            data["lt_placement"] = "fused"
    estimation = data.get("estimation")
    if isinstance(estimation, dict):  # which tokens a fit uses: nothing when nothing is fitted
        fits = getattr(estimator, "needs_statistics", True) or getattr(estimator, "needs_tokens", False)
        if not (fits or selects_by_ls):
            estimation["tokens"] = "all"
        if estimation.get("tokens") != "skip_first":
            estimation.pop("first", None)
    data.pop("solver_schedule", None)  # acts only through objective.schedule
    if objective.get("solver") == "adam":  # Adam is mini-batch under either schedule
        objective.pop("schedule", None)
    if data.get("cuts") is not None:
        for key in ("selection", "n_prune", "num_lts"):
            data.pop(key, None)
    elif data.get("num_lts") == 1:
        data.pop("merge_consecutive", None)
        data.pop("multi_lt", None)
    healing = data.get("healing")
    if isinstance(healing, dict) and healing.get("name") == "none":  # its data key only lets sweeps set it
        healing = data["healing"] = {"name": "none"}
    if isinstance(healing, dict):  # how training is logged and recomputes activations, not what it learns
        healing.pop("log_every", None)
        healing.pop("gradient_checkpointing", None)
    sections = [data.get("calibration"), data.get("eval"), (healing or {}).get("data")]
    for section in sections:  # a local data file enters by content, not by path
        section = section if isinstance(section, dict) else {}
        for field in ("path", "prompts_path", "prompts_data_files"):
            paths = section.get(field)
            paths = paths if isinstance(paths, list) else [paths]
            files = [Path(p).expanduser() for p in paths if isinstance(p, str) and Path(p).expanduser().is_file()]
            if files:
                memo = Path(str(cfg.get("cache_dir", ".cache"))) / "fingerprints"
                section[f"{field}_sha256"] = [file_digest(f, memo) for f in files]
    precision = capture_precision(cfg)
    takes_products = getattr(estimator, "needs_statistics", True) or objective.get("init") == "ls"
    selects_by_products = data.get("cuts") is None and selection.get("metric") in ("ls_residual", "cka", "cca")
    if precision != "float64" and (takes_products or selects_by_products):
        data["capture_precision"] = precision  # float32 products round differently from float64
    if not float(data.get("mask_ratio") or 0):
        data["mask_ratio"] = 0
        data.pop("mask_passes", None)
    data["semantics_version"] = SEMANTICS_VERSION
    return _by_value(data)


def _digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_hash(cfg: DictConfig, weights: dict | None = None) -> str:
    """Hash of the job's effective settings (equal for equivalent spellings)."""
    return _digest(effective_settings(cfg, weights))


def setting_hash(cfg: DictConfig, weights: dict | None = None) -> str:
    """The config hash without the seed (``calibration.seed`` follows ``seed``): runs that share it
    differ only in the seed."""
    data = effective_settings(cfg, weights)
    for key in SEED_KEYS:
        data.pop(key, None)
    for group in ("calibration", "healing"):
        if isinstance(data.get(group), dict) and data[group].get("seed") == cfg.get("seed"):
            data[group].pop("seed", None)
    return _digest(data)
