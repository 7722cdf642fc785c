"""A method from another installed package (:mod:`replaceme_exp.plugins`): a tiny plugin package is built
and installed with pip into a folder of its own, and ``run.py`` with that folder on its path runs a job of
the plugin's method, its estimator, its objective's settings and its YAML, found through entry points."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers.config import ROOT
from helpers.jobs import SMOKE
from safetensors.torch import load_file


PLUGIN = "replaceme_halfway"

PYPROJECT = f"""
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{PLUGIN}"
version = "0.1.0"

[project.entry-points."replaceme_exp.plugins"]
halfway = "{PLUGIN}.method"

[project.entry-points."replaceme_exp.conf"]
{PLUGIN} = "{PLUGIN}.conf"

[tool.setuptools]
packages = ["{PLUGIN}", "{PLUGIN}.conf", "{PLUGIN}.conf.objective"]

[tool.setuptools.package-data]
"{PLUGIN}.conf.objective" = ["*.yaml"]
"""

METHOD = '''
"""Halfway: the LS transform moved ``weight`` of the way from the identity (a plugin's method)."""

import torch

from replaceme_exp.config.schema import Group, ObjectiveConfig, key, register_shape
from replaceme_exp.estimation.estimators import LeastSquaresEstimator
from replaceme_exp.methods.plugin import Method, register


@register_shape("objective")
@Group
class HalfwayObjectiveConfig(ObjectiveConfig):
    weight: float = key(0.5, doc="how far from I toward the LS transform")


class HalfwayEstimator(LeastSquaresEstimator):
    def __init__(self, name: str = "halfway", weight: float = 0.5):
        super().__init__(name)
        self.weight = weight

    def estimate(self, stats, alpha, structure="generic"):
        ls = super().estimate(stats, alpha, structure).to(torch.float64)
        eye = torch.eye(ls.shape[0], dtype=torch.float64, device=ls.device)
        return eye + self.weight * (ls - eye)


register(
    Method(
        "halfway",
        title="Halfway",
        docs="halfway.md",
        label=lambda job: f"Halfway ({job.config.objective.weight})",
        estimators=(HalfwayEstimator,),
        presets=("halfway",),
        setting_columns={"halfway_weight": "Halfway: how far from I toward the LS transform."},
        settings_of=lambda config: {"halfway_weight": config.objective.weight},
    )
)
'''

OPTION = f"""
defaults:
  - /schema/objective/halfway@_here_
  - _self_

_target_: {PLUGIN}.method.HalfwayEstimator
name: halfway
weight: 0.25
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The plugin package built and installed (pip, no index, no dependencies) into a folder of its own."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "source"
    package = source / PLUGIN
    (package / "conf" / "objective").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    for init in (package, package / "conf", package / "conf" / "objective"):
        (init / "__init__.py").write_text("")
    (package / "method.py").write_text(textwrap.dedent(METHOD))
    (package / "conf" / "objective" / "halfway.yaml").write_text(OPTION)
    site = root / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation"]
    subprocess.run([*install, "--quiet", "--target", str(site), str(source)], check=True, capture_output=True)
    assert (site / PLUGIN / "method.py").is_file()
    return site


def run(site: Path, results: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(site))
    args = [*SMOKE, f"results_dir={results}", f"capture.cache_dir={results}/stats", "save_model=transform", *overrides]
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)


def row_of(results: Path) -> dict:
    (path,) = (results / "runs").glob("*/*.parquet")
    return pd.read_parquet(path).iloc[0].to_dict()


@pytest.mark.slow
def test_an_installed_plugin_package_adds_a_method_that_runs_a_job(installed, tmp_path):
    cuts = "cuts=[[2,4]]"
    done = run(installed, tmp_path / "halfway", "objective=halfway", cuts)
    assert done.returncode == 0, done.stderr[-3000:]
    row = row_of(tmp_path / "halfway")
    assert row["status"] == "finished", row["error"]
    assert row["method"] == "Halfway (0.25)" and row["objective"] == "halfway" and row["halfway_weight"] == 0.25
    ls = run(installed, tmp_path / "ls", "objective=ls", cuts)
    assert ls.returncode == 0, ls.stderr[-3000:]
    assert pd.isna(row_of(tmp_path / "ls")["halfway_weight"])  # another method's setting: empty
    # the plugin's T is I + 0.25 (T_ls - I) of the project's own LS transform over the same tokens
    mine = load_file(next((tmp_path / "halfway" / "transforms").glob("*.safetensors")))["2-4"]
    reference = load_file(next((tmp_path / "ls" / "transforms").glob("*.safetensors")))["2-4"]
    eye = torch.eye(reference.shape[0], dtype=torch.float64)
    torch.testing.assert_close(mine, eye + 0.25 * (reference - eye), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_without_the_plugin_on_the_path_its_option_is_unknown(tmp_path):
    done = run(tmp_path / "nothing", tmp_path / "results", "objective=halfway")
    assert done.returncode != 0 and "halfway" in done.stderr


@pytest.mark.slow
def test_a_plugin_that_fails_to_import_stops_the_run_in_one_line_naming_its_entry_point(tmp_path):
    site = tmp_path / "site"
    info = site / "broken_plugin-0.1.dist-info"  # what an installer writes
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[replaceme_exp.plugins]\nbroken = broken_plugin\n")
    (site / "broken_plugin.py").write_text("raise ImportError('needs a package that is not installed')\n")
    done = run(site, tmp_path / "results", "objective=ls")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "plugin broken (broken_plugin" in line and "needs a package that is not installed" in line
