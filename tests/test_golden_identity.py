"""Refactors change no result: the config hash, the setting hash and the row's setting columns of every
shipped option, preset, template job and special spelling equal the values pinned in
``tests/golden/config_identity.json`` (written by ``tests/golden/compositions.py`` from the code before
the job spec existed, commit 3c73b47), or where a named change moved them on purpose, the hashes it
recorded (``tests/golden/identity_changes.json``); configurations that code refused are refused.

The row's setting columns changed on purpose where the old row described a setting as spelled rather
than as it acts (:func:`as_now_described`)."""

from __future__ import annotations

import json

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

from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.spec import JobSpec

pytestmark = [pytest.mark.unit, pytest.mark.slow]


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
    - ``job`` says which job wrote the row: ``prune`` (``evaluate`` rows come from ``job=evaluate``).
    """
    out = dict(pinned)
    selects = cfg.cuts is None
    if selects and cfg.get("protocol", "paper") == "paper":  # official rows were recorded as they run
        out["selection_metric"] = cfg.selection.metric + ("_last" if cfg.selection.tokens == "last" else "")
    if "solver" in cfg.objective:
        out["solver"] = cfg.objective.solver
    if selects and cfg.num_lts == 1:
        out["merge_consecutive"] = out["multi_lt"] = None
    if cfg.objective.name == "identity":
        out["plain_checkpoint"] = True
    if isinstance(out.get("healing_settings"), dict):
        out["healing_settings"] = {**out["healing_settings"], "master_weights": cfg.healing.master_weights}
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
    return out


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


def test_identity_of_every_composition_is_unchanged(pinned, changes, tmp_path):
    changed = []
    for overrides, cfg in composed(checked_compositions(), str(tmp_path)):
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
