"""What a sweep says about itself: its name (a sweep over several presets is named for all of them,
``experiment=replaceme_ls,uidl_baseline``, not for its first job's preset) and where its alpha did
nothing (an objective that takes none; a ridge whose measured effect on T is below the tolerance)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from replaceme_exp.capture import LinearStats
from replaceme_exp.estimation import LeastSquaresEstimator
from replaceme_exp.estimation.fitting import alpha_effect
from replaceme_exp.runtime.sweep_name import sweep_name, sweep_overrides
from replaceme_exp.runtime.sweep_summary import ALPHA_TOLERANCE, alpha_notes


def multirun_yaml(folder, task: list[str], params: dict | None = None):
    """The ``multirun.yaml`` Hydra writes into a sweep directory before its jobs start."""
    config = {"hydra": {"overrides": {"task": task}, "sweeper": {"params": params or {}}}, "alpha": 0}
    OmegaConf.save(OmegaConf.create(config), folder / "multirun.yaml")
    return folder


def test_a_sweep_over_presets_is_named_for_the_sweep_not_its_first_job(tmp_path):
    sweep = multirun_yaml(tmp_path, ["experiment=replaceme_ls,uidl_baseline", "alpha=0,10", "results_dir=x"])
    overrides = sweep_overrides(sweep)
    for job_preset in ("replaceme_ls", "uidl_baseline"):  # every job of it: one name
        name = sweep_name({"experiment": job_preset}, True, overrides)
        assert name == "experiment=replaceme_ls,uidl_baseline"
    # one preset, other settings swept: named for the preset, as before
    (tmp_path / "one").mkdir()
    single = sweep_overrides(multirun_yaml(tmp_path / "one", ["experiment=uidl_baseline", "n_prune=2,4"]))
    assert sweep_name({"experiment": "uidl_baseline"}, True, single) == "experiment/uidl_baseline"
    # a template sweeping presets inside it is the template's sweep
    template = ["+paper=clip"]
    params = {"n_prune": "3,6", "experiment": "replaceme_ls,uidl_baseline"}
    (tmp_path / "t").mkdir()
    inside = sweep_overrides(multirun_yaml(tmp_path / "t", template, params))
    assert sweep_name({"paper": "clip", "experiment": "uidl_baseline"}, True, inside) == "paper/clip"
    assert sweep_name({}, True, sweep_overrides(tmp_path / "missing")) == "sweep"
    assert sweep_name({}, False) == "single"


def status(objective, given, acted, **values) -> dict:
    return {"status": "finished", "objective": objective, "given_alpha": given, "alpha": acted, **values}


def test_the_summary_says_where_alpha_does_nothing():
    statuses = [
        status("ls", 0, 0.0, alpha_scale="token_sum"),
        status("ls", 10, 10.0, alpha_scale="token_sum", alpha_effect={"4-6": 0.3}, dtype="float32"),
        status("ls", 0.01, 0.01, alpha_effect={"4-6": 2e-9}, gram_mean_eigenvalue={"4-6": 3e4}, dtype="float32"),
        # SmolLM2, pydoc calibration, cut [12,16): alpha=0.01 moved T by 2.7e-06, above float32's resolution
        status("ls", 0.02, 0.02, alpha_effect={"12-16": 2.7e-6}, dtype="float32"),
        status("ls", 0.03, 0.03, alpha_effect={"12-16": 2.7e-6}, dtype="bfloat16"),
        status("identity", 10, 0.0, alpha_scale=None),
        {**status("identity", 100, 0.0, alpha_scale=None), "status": "skipped"},
    ]
    notes = alpha_notes(statuses)
    assert notes[0] == (
        "alpha does nothing for objective=identity takes no alpha: its jobs at alpha=10,100 are its alpha=0 "
        "configuration"
    )
    assert notes[1].startswith(
        "alpha=0.01 does nothing for objective=ls: it moved T by 2.0e-09 relative to alpha=0 (measured), below the "
        "resolution of float32 weights (1.2e-07)"
    )
    assert "mean eigenvalue of M^T M: 3e+04" in notes[1]
    assert notes[2] == "alpha=0.02 moved objective=ls's T by 2.7e-06 relative to alpha=0 (measured)"
    assert notes[3].startswith("alpha=0.03 does nothing for objective=ls") and "bfloat16 weights (7.8e-03)" in notes[3]
    assert notes[4] == "alpha=10 moved objective=ls's T by 3.0e-01 relative to alpha=0 (measured)" and len(notes) == 5


def test_alpha_effect_is_measured_against_an_independent_solve():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(400, 6, generator=g, dtype=torch.float64) * 30  # token sums: M^T M's eigenvalues ~ 4e5
    r = m @ torch.randn(6, 6, generator=g, dtype=torch.float64) + torch.randn(400, 6, generator=g, dtype=torch.float64)
    stats = LinearStats((1, 3), m.T @ m, m.T @ r, float(r.pow(2).sum()), 400)
    estimator = LeastSquaresEstimator()
    plain = torch.linalg.lstsq(m, r).solution
    for alpha in (0.01, 1e5):
        ridge = torch.linalg.solve(m.T @ m + alpha * torch.eye(6, dtype=torch.float64), m.T @ r)
        expected = float((ridge - plain).norm() / plain.norm())
        measured = alpha_effect(estimator, stats, estimator.estimate(stats, alpha), "generic")
        assert measured == pytest.approx(expected, rel=1e-6, abs=1e-14)
    small = alpha_effect(estimator, stats, estimator.estimate(stats, 0.01), "generic")
    assert small < ALPHA_TOLERANCE["float32"]  # alpha=0.01 on token sums of 400 tokens: numerically nothing
    assert alpha_effect(estimator, stats, estimator.estimate(stats, 1e5), "generic") > 0.01
