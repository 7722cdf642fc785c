#!/usr/bin/env bash
# Issue 50: torchmin 0.1.0 against 0.0.2 (what the official code installed) on the same tokens: the
# official-protocol L-BFGS job (one step per 1024-token batch, float32, the cosine loss) run once with
# each version, then its transforms and scores compared (benchmarks/torchmin_versions.py).
#   scripts/torchmin-versions.sh [out folder] [more overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-evidence/torchmin-versions}
shift || true
make -s torchmin-0.1.0
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
job=(protocol=official objective=cosine objective.solver=lbfgs n_prune=0.25 eval=quick save_model=transform
     "capture.cache_dir=$out/stats" tracking.wandb.mode=disabled "$@")
.venv/bin/python run.py "${job[@]}" "results_dir=$out/torchmin-0.0.2"
PYTHONPATH=.torchmin-0.1.0 .venv/bin/python run.py "${job[@]}" "results_dir=$out/torchmin-0.1.0"
.venv/bin/python benchmarks/torchmin_versions.py "$out/torchmin-0.0.2" "$out/torchmin-0.1.0" | tee "$out/comparison.txt"
