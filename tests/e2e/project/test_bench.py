"""``make bench``'s script (benchmarks/bench_capture.py) runs on a tiny model and prints its JSON: it
had stopped importing when the pipeline was restructured, and nothing ran it. Its speed section
(the unpruned model against plain removal and a separate T) reports every ratio with its range."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.config import ROOT


@pytest.mark.slow
def test_the_benchmark_runs_on_a_tiny_model_and_reports_its_ratios():
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_capture.py", "model=tiny_llama", "n_prune=2"],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["model"] == "tiny_llama" and result["capture_passes_auto"] in ("one", "two")
    ratios = {k: v for k, v in result.items() if "_over_" in k}
    assert {"capture_over_forward", "cosine_lbfgs_float64_over_float32", "statistics_float32_over_float64"} <= set(
        ratios
    )
    assert {"start_to_first_stage_over_import_torch", "statistics_float64_over_forward"} <= set(ratios)
    assert all(isinstance(v, float) and v > 0 for v in ratios.values()), ratios
    # the LS path's memory does not grow with the calibration tokens (statistics, not activations)
    assert result["ls_mem_tokens_4x"] == 4 * result["ls_mem_tokens_1x"]
    assert result["ls_peak_mem_ratio_4x_data"] < 1.5
    # full-batch L-BFGS gets closer than the paper's Adam recipe, in either precision alike
    lbfgs, lbfgs32 = result["cosine_lbfgs_heldout_cos"], result["cosine_lbfgs_float32_heldout_cos"]
    assert lbfgs < result["cosine_paper_heldout_cos"]
    assert abs(lbfgs - lbfgs32) < 0.01 * lbfgs
    # what pruning buys: 2 of 6 blocks removed, plainly and with a separate T, against the unpruned model
    assert result["speed_rounds"] == 3 and result["speed_memory_method"] == "profiler_memory_events"
    for kind in ("plain", "separate"):
        for metric in ("prefill", "decode_b1", "decode_batch"):
            low, mid, high = (result[f"speed_{kind}_{metric}_{s}"] for s in ("speedup_min", "speedup", "speedup_max"))
            assert 0 < low <= high and isinstance(mid, float), (kind, metric)
        for ratio in ("peak_infer_mem_ratio", "param_count_ratio", "checkpoint_bytes_ratio"):
            assert 0 < result[f"speed_{kind}_{ratio}"] < 1, (kind, ratio)
    # lm-eval's requests scored with the head on the scored positions (the same scores, checked in the script)
    assert result["lm_eval_requests"] == 256 and result["lm_eval_scored_positions_speedup"] > 0
    assert result["lm_eval_scored_positions_speedup_min"] <= result["lm_eval_scored_positions_speedup_max"]
    # the separate T adds d x d parameters to plain removal
    assert result["speed_separate_param_count_ratio"] > result["speed_plain_param_count_ratio"]
