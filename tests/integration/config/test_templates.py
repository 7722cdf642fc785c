"""Every multirun template composes and expands to the number of jobs its table, figure or study
declares (replaceme_exp/reporting/artifacts.py), and belongs to exactly one of them."""

from __future__ import annotations

import pytest

import replaceme_exp.reporting  # noqa: F401  (registers every table, figure and study)


@pytest.mark.slow
def test_a_template_path_outside_the_templates_is_refused_in_one_line(tmp_path):
    from helpers.jobs import run_cli

    proc, _ = run_cli(["-m", "+paper=../../conf/config"], tmp_path)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2
    assert lines == [lines[0]] and "+paper=../../conf/config: leaves multirun_templates/paper" in lines[0]
    assert "search path" not in lines[0]
