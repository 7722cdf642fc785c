"""The evaluate job (``job=evaluate``): the unpruned model or a saved checkpoint through the eval suite,
one row, measured as a pruning job measures its models (the official code's ``eval_model(model_path)``)."""

from __future__ import annotations

import pytest
from helpers.jobs import SMOKE, run_cli


@pytest.mark.slow
def test_the_command_line_refuses_a_missing_checkpoint_in_one_line(tmp_path):
    missing = tmp_path / "models" / "nothing"
    proc, _ = run_cli([*SMOKE, "job=evaluate", f"evaluate.checkpoint={missing}"], tmp_path)
    assert proc.returncode == 1
    log = proc.stdout + proc.stderr
    assert f"ConfigError: evaluate.checkpoint='{missing}': no such checkpoint directory" in log
    assert "Traceback" not in log and "stage load" not in log  # refused before anything loads
