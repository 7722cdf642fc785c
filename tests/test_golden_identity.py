"""Refactors change no result: the config hash, the setting hash and the row's setting columns of every
shipped option, preset, template job and special spelling equal the values pinned in
``tests/golden/config_identity.json`` (written by ``tests/golden/compositions.py`` from the code before
the job spec existed, commit 3c73b47), or where a named change moved them on purpose, the hashes it
recorded (``tests/golden/identity_changes.json``); configurations that code refused are refused.

The row's setting columns changed on purpose where the old row described a setting as spelled rather
than as it acts (:func:`as_now_described`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from golden.compositions import (
    CHANGES,
    GOLDEN,
    IDENTITY_CHANGES,
    WEIGHTS,
    all_compositions,
    checked_compositions,
    composed,
    current_identity,
    expected_hashes,
    key,
)
from omegaconf import ListConfig

from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.spec import JobSpec

pytestmark = [pytest.mark.unit, pytest.mark.slow]
SHARDS = 4


ISSUE_25_COLUMNS = (
    "selection_window",
    "selection_final_norm",
    "selection_early_barrier",
    "selection_latter_barrier",
    "selection_merge_layers",
    "selection_interval",
    "selection_threshold",
    "selection_lowest",
    "selection_highest",
    "selection_samples",
    "selection_merge",
    "replacement",
    "replacement_settings",
    "ridge_criterion",
    "ridge_folds",
    "ridge_grid",
)


def as_now_described(pinned: dict, cfg) -> dict:
    """The pinned setting columns with the changes made on purpose when the job spec came:

    - ``selection_metric`` is set when the job starts (it was set only when the capture began, so a
      job that failed before had None; a finished row is unchanged);
    - ``solver`` of a numerical objective likewise (it was set after the fit);
    - ``merge_consecutive`` and ``multi_lt`` are None for a single selected cut, where they cannot act
      (the hash always left them out, so the row of a first spelling described the others wrongly);
    - ``plain_checkpoint`` is true for ``identity``, which attaches nothing in either placement;

    and after it (issue 22):

    - ``healing_settings`` include ``master_weights``; ``healing_master_weights`` says it where it
      acts: bf16 / fp16 weights that train (``full_model``; ``lt_only`` with a separate T);
    - ``regularizer_warning`` says why an L1 / L2 penalty on T with the scale-free cosine loss is
      ill-posed (None elsewhere);
    - the protocol axis: ``protocol``, ``calibration_batch_order``, ``calibration_drop_last``,
      ``capture_dtype``, ``padded_positions``, ``touching_cuts``;
    - ``job`` says which job wrote the row: ``prune`` (``evaluate`` rows come from ``job=evaluate``);

    and in issue 24 (rows that explain their numbers):

    - ``method`` names the method (``ReplaceMe LS``, ``UIDL``, ...; :func:`described_method`), ``modality``
      the kind of model (``text``, ``vision``);
    - the held-out text a perplexity is measured on: ``eval_text``, ``eval_seq_len``, ``eval_max_windows``
      (None for a vision encoder), ``eval_text_path`` / ``eval_text_sha256``;
    - the local files of the calibration and healing text: ``calibration_path`` / ``calibration_sha256``,
      ``healing_data_path`` / ``healing_data_sha256`` (None without one: no pinned composition names one);

    and in issue 25 (peer methods), None in every pinned composition (none selects by search or
    replaces a cut by a network):

    - a selection's own keys, ``selection_<key>`` (ShortGPT's ``window``, SLEB's barriers, LaCo's C, I, T, ...);
    - ``replacement`` and ``replacement_settings`` (LLM-Streamline's trained network).
    - ``ridge_criterion``, ``ridge_folds``, ``ridge_grid`` (``objective=ls_ridge_identity``'s settings);

    and after it, ``solver_precision``: the dtype the solver computes T in, float32 for Adam, float64 for
    the other solvers by default (they had run in float32; their hashes moved, change
    ``solver-precision``), None for a closed form.
    """
    out = dict(pinned)
    selects = cfg.cuts is None
    if selects and cfg.get("protocol", "paper") == "paper":  # official rows were recorded as they run
        out["selection_metric"] = cfg.selection.metric + ("_last" if cfg.selection.get("tokens") == "last" else "")
    if "solver" in cfg.objective:
        out["solver"] = cfg.objective.solver
    if selects and cfg.num_lts == 1:
        out["merge_consecutive"] = out["multi_lt"] = None
    if cfg.objective.name == "identity":
        out["plain_checkpoint"] = True
    if isinstance(out.get("healing_settings"), dict):
        out["healing_settings"] = {
            "loss": "lm",  # issue 25: LinearPatch's distillation settings, at what every earlier healing ran
            "lr_schedule": "constant",
            **out["healing_settings"],
            "master_weights": cfg.healing.master_weights,
        }
    separate_t = cfg.lt_placement == "separate" and cfg.objective.name != "identity"
    trains = cfg.healing.name == "full_model" or (cfg.healing.name == "lt_only" and separate_t)
    low_precision = cfg.model.dtype in ("bfloat16", "float16")
    out["healing_master_weights"] = cfg.healing.master_weights if trains and low_precision else None
    literal = out.get("regularizer") in ("l1", "l2") and out.get("alpha") and cfg.objective.get("loss") == "cosine"
    out["regularizer_warning"] = (
        f"objective.loss=cosine is invariant to T's scale: regularizer={out['regularizer']} only shrinks T, by an "
        f"amount set by lr x steps, not by alpha (well-posed: regularizer={out['regularizer']}_to_identity, or "
        "objective=cosine_exact)"
        if literal
        else None
    )
    # the protocol axis (issue 22): columns a row recorded before it had none of; under
    # protocol=paper (every pinned composition) each says this project's default as it acts
    calibration = cfg.calibration
    text_calibration = "batch_order" in calibration
    single_cut = selects and cfg.num_lts == 1
    absent = {
        "protocol": cfg.get("protocol", "paper"),
        "calibration_batch_order": calibration.get("batch_order") if text_calibration else None,
        "calibration_drop_last": calibration.get("drop_last") if text_calibration else None,
        "capture_dtype": cfg.model.get("capture_dtype") or cfg.model.dtype,
        "padded_positions": False,
        "touching_cuts": None if single_cut or cfg.merge_consecutive else cfg.get("touching_cuts", "apart"),
    }
    for column, value in absent.items():
        if out.get(column, "<absent>") == "<absent>":
            out[column] = value
    out["job"] = "prune"
    vision = cfg.model.source == "hub_clip_vision" or (cfg.model.get("config") or {}).get("model_type") == "clip"
    text_file = not vision and cfg.eval.get("text") == "text_file" and cfg.eval.get("path")
    if out.get("method", "<absent>") == "<absent>":  # a composition recorded with it keeps its own (peer methods)
        out["method"] = described_method(cfg)
    out.update(
        modality="vision" if vision else "text",
        eval_text=None if vision else cfg.eval.text,
        eval_seq_len=None if vision else cfg.eval.seq_len,
        eval_max_windows=None if vision else cfg.eval.max_windows,
        eval_text_path=str(Path(cfg.eval.path).absolute()) if text_file else None,
        eval_text_sha256=hashlib.sha256(Path(cfg.eval.path).read_bytes()).hexdigest() if text_file else None,
    )
    if out.get("solver_precision", "<absent>") == "<absent>":
        solver = out.get("solver")
        out["solver_precision"] = None if solver is None else "float32" if solver == "adam" else "float64"
    for column in ISSUE_25_COLUMNS:  # as recorded where a composition came with them
        if out.get(column, "<absent>") == "<absent>":
            out[column] = None
    healing_data = cfg.healing.data if cfg.healing.name != "none" else {}
    for prefix, section in (("calibration", cfg.calibration), ("healing_data", healing_data)):
        fields = [section.get(k) for k in ("path", "prompts_path", "prompts_data_files")]
        fields += [part.get("path") for part in (section.get("parts") or {}).values()]
        named = [f for field in fields for f in (field if isinstance(field, (list, ListConfig)) else [field]) if f]
        files = [Path(f).expanduser() for f in named]
        digests = [hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else None for f in files]
        paths = [str(f.absolute()) for f in files]
        out[f"{prefix}_path"] = (paths[0] if len(paths) == 1 else paths) or None
        out[f"{prefix}_sha256"] = (digests[0] if len(digests) == 1 else digests) or None
    return out


def described_method(cfg) -> str:
    """The ``method`` of a pinned composition, by hand: ReplaceMe and the objective (a numerical one by its
    loss), or the blocks removed with nothing fused: UIDL where the last tokens' angular distance chose
    the cut; then the healing."""
    objective = cfg.objective.get("loss") or cfg.objective.name
    names = {"ls": "LS", "cosine_exact": "cosine (exact)", "mse": "MSE", "elasticnet": "elastic net"}
    if cfg.objective.name != "identity":
        method = "ReplaceMe " + names.get(objective, objective)
    else:
        uidl = cfg.cuts is None and cfg.selection.metric == "angular" and cfg.selection.tokens == "last"
        method = "UIDL" if uidl else "block removal"
    healing = {"lt_only": "LT healing", "full_model": "full healing", "lora": "LoRA healing"}
    return method + (f" + {healing[cfg.healing.name]}" if cfg.healing.name != "none" else "")


@pytest.fixture(scope="module")
def pinned() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def changes() -> dict:
    return json.loads(CHANGES.read_text())


def test_every_recorded_change_is_named_and_of_a_pinned_composition(pinned, changes):
    assert {c["change"] for c in changes.values()} <= set(IDENTITY_CHANGES)
    assert {name for name, c in changes.items() if not c.get("added")} <= set(pinned)


def test_every_composition_is_pinned(pinned, changes):
    retired = {name for name, c in changes.items() if c.get("retired")}
    added = {name for name, c in changes.items() if c.get("added")}
    assert {key(o) for o in all_compositions()} == (set(pinned) - retired) | added


@pytest.mark.parametrize("shard", range(SHARDS))
def test_identity_of_every_composition_is_unchanged(pinned, changes, tmp_path, shard):
    """Every ``SHARDS``-th composition from ``shard`` on (the shards run on parallel test workers)."""
    changed = []
    for overrides, cfg in composed(checked_compositions()[shard::SHARDS], str(tmp_path)):
        if changes.get(key(overrides), {}).get("added"):  # new since the pin: as recorded then
            old, now = changes[key(overrides)], json.loads(json.dumps(current_identity(cfg)))
            expected = {k: old[k] for k in now}
            if isinstance(old["row_settings"], dict):  # with the columns that came after it
                recorded = old["row_settings"]
                columns = as_now_described({k: recorded.get(k, "<absent>") for k in now["row_settings"]}, cfg)
                expected["row_settings"] = json.loads(json.dumps(columns))
            if expected != now:
                changed.append((key(overrides), now, expected))
            continue
        old = pinned[key(overrides)]
        refused = old["valid"] != "valid" or isinstance(old["row_settings"], str)
        try:
            spec = JobSpec.from_config(cfg)
        except ConfigError as err:
            at_start = old["valid"] == "valid"  # refused when the job started: the same message now
            if not refused or (at_start and old["row_settings"] != f"error: ConfigError: {err}"):
                changed.append((key(overrides), f"refused: {err}", old))
            continue
        if refused:
            changed.append((key(overrides), "accepted", old))
            continue
        now = {
            "config_hash": spec.config_hash,
            "setting_hash": spec.setting_hash,
            "config_hash_weights": spec.with_weights(WEIGHTS).config_hash,
            "setting_hash_weights": spec.with_weights(WEIGHTS).setting_hash,
            "columns": spec.setting_columns(),
        }
        recorded = changes.get(key(overrides), {}).get("row_settings")  # a change recorded the row as it was then
        described = json.loads(json.dumps(recorded)) if recorded else old["row_settings"]
        expected = as_now_described({k: described.get(k, "<absent>") for k in now["columns"]}, cfg)
        if recorded:
            now["columns"] = json.loads(json.dumps(now["columns"]))
        then = expected_hashes(pinned, changes, key(overrides))
        if {**then, "columns": expected} != now:
            changed.append((key(overrides), now, {**then, "columns": expected}))
    assert not changed, f"{len(changed)} changed, first: {changed[0]}"
