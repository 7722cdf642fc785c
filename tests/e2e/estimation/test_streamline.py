"""LLM-Streamline (objective=streamline_ffn / streamline_layer, experiment=llm_streamline /
llm_streamline_layer): the cut's hidden states as the model computes them, the block run alone as
inside the model, the official learning-rate schedule, training that lowers the loss, and the pruned
models: the FFN variant equals a hand-built model with the FFN written out, the layer variant is a
plain checkpoint with the trained block, and the export builds what save_model=full saves."""

from __future__ import annotations

import math

import pytest
from helpers.jobs import run_cli

from replaceme_exp.results.store import ResultsStore


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["llm_streamline", "llm_streamline_layer"])
def test_each_preset_runs_end_to_end_from_the_command_line(tmp_path, preset):
    proc, _ = run_cli(["debug=smoke", f"experiment={preset}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = ResultsStore(tmp_path).load().to_dict("records")
    assert (
        row["method"].startswith("LLM-Streamline")
        and row["status"] == "finished"
        and row["replacement"] == ("ffn" if preset == "llm_streamline" else "layer")
    )
    assert math.isfinite(row["ppl_heldout"]) and row["replacement_steps"] >= 1
    # 24 calibration sequences: one optimizer step, at the warm-up's learning rate 0: marked untrained
    assert (row["replacement_steps"], row["replacement_lr_max"], row["untrained"]) == (1, 0.0, True)
