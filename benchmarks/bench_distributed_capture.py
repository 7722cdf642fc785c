"""Wall time of a job's calibration captures split over 2 processes (torchrun, 1 thread each) against
one process with the same total threads (2), on SmolLM2-135M (``debug=quick`` with 8 batches of
pydoc text), alternating the two a few rounds so that a shared machine's load hits both alike.

    python benchmarks/bench_distributed_capture.py [--rounds 3] [--results /tmp/bench_dp]

Prints each run's ``time_capture_s`` (rank 0's capture stages, the merge's wait for the other rank
included) and ``time_total_s``, and the median ratio (2 ranks / 1 process)."""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
JOB = [
    "debug=quick",
    "calibration=pydoc",
    "calibration.n_samples=64",
    "calibration.seq_len=256",
    "calibration.batch_size=8",
    "capture.cache=false",
    "eval.speed.enabled=false",
    "force=true",
]


def run(results: Path, ranks: int) -> dict:
    """One job (``ranks`` processes of 1 thread, or one process of 2 threads); its row's times."""
    threads = "1" if ranks > 1 else "2"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS=threads)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone"]
    before = set(glob.glob(f"{results}/runs/*/*.parquet"))
    args = [*(launcher if ranks > 1 else [sys.executable]), "run.py", *JOB, f"results_dir={results}"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    (new,) = set(glob.glob(f"{results}/runs/*/*.parquet")) - before
    row = pd.read_parquet(new).iloc[0]
    return {"ranks": ranks, "capture_s": row["time_capture_s"], "total_s": row["time_total_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default="/tmp/bench_distributed_capture")
    args = parser.parse_args()
    results = Path(args.results)
    found = []
    for i in range(args.rounds):
        for ranks in (1, 2) if i % 2 == 0 else (2, 1):
            found.append(run(results, ranks))
            print(found[-1], flush=True)
    frame = pd.DataFrame(found)
    medians = frame.groupby("ranks").median()
    print(medians.to_string())
    ratio = statistics.median(frame[frame.ranks == 2].capture_s) / statistics.median(frame[frame.ranks == 1].capture_s)
    print(f"capture wall time, 2 ranks x 1 thread / 1 process x 2 threads: {ratio:.2f}")


if __name__ == "__main__":
    main()
