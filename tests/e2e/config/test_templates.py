"""Every multirun template composes and expands to the number of jobs its table, figure or study
declares (replaceme_exp/reporting/artifacts.py), and belongs to exactly one of them."""

from __future__ import annotations

import pytest
from helpers.config import ROOT

import replaceme_exp.reporting  # noqa: F401  (registers every table, figure and study)


@pytest.mark.slow
def test_templates_resolve_from_the_package_from_any_directory_and_cannot_be_hijacked(tmp_path):
    import os
    import subprocess
    import sys

    fake = tmp_path / "multirun_templates" / "paper"
    fake.mkdir(parents=True)
    (fake / "regularization.yaml").write_text("# @package _global_\nn_prune: 1\nhijacked: true\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

    def composed(template: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(ROOT / "run.py"), "--cfg", "job", f"+paper={template}"]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    proc = composed("regularization")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hijacked" not in proc.stdout and "name: llama3_8b_instruct" in proc.stdout
    unknown = composed("no_such_table")
    assert unknown.returncode != 0 and "no_such_table" in unknown.stderr
