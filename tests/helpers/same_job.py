"""The tiny job (``debug=smoke``) in one process and over several, and the check that both found the
same thing: one row each, the same selection distances and cuts, the same transforms."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from safetensors.torch import load_file

from helpers.config import ROOT


def run_job(results_dir, ranks: int, *overrides, env_extra=None, timeout=300):
    """``run.py debug=smoke`` (the tiny job), under torchrun with ``ranks`` processes (1: plain)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", **(env_extra or {}))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone"]
    args = [
        *(launcher if ranks > 1 else [sys.executable]),
        "run.py",
        "debug=smoke",
        f"results_dir={results_dir}",
        f"capture.cache_dir={results_dir}/stats",
        "save_model=transform",
        "eval.speed.enabled=false",
        *overrides,
    ]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def rows_of(results_dir) -> list[dict]:
    return [pd.read_parquet(p).iloc[0].to_dict() for p in glob.glob(f"{results_dir}/runs/*/*.parquet")]


def transforms_of(results_dir) -> dict:
    (path,) = glob.glob(f"{results_dir}/transforms/*.safetensors")
    return load_file(path)


def assert_same_job(one, two) -> None:
    (row1,), (row2,) = rows_of(one), rows_of(two)  # rank 1 wrote no row
    assert row1["status"] == row2["status"] == "finished"
    assert (row1["world_size"], row2["world_size"]) == (1, 2)
    assert row2["capture_timeout_s"] == 1800
    assert row1["cuts"] == row2["cuts"] and row1["fit_tokens"] == row2["fit_tokens"]
    d1, d2 = json.loads(row1["candidate_distances"]), json.loads(row2["candidate_distances"])  # [[start, end, d]]
    assert len(d1) == 4 and [d[:2] for d in d1] == [d[:2] for d in d2]
    assert [d[2] for d in d2] == pytest.approx([d[2] for d in d1], rel=1e-10)
    assert row2["selection_distance"] == pytest.approx(row1["selection_distance"], rel=1e-10)
    t1, t2 = transforms_of(one), transforms_of(two)
    assert t1.keys() == t2.keys()
    for key in t1:
        assert float((t2[key] - t1[key]).abs().max() / t1[key].abs().max()) < 1e-10, key
