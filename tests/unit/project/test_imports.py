"""What importing the job costs: no heavy library is imported before a job uses it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.config import ROOT


# Each imported only by the jobs (or reports) that use it: lm-eval suites, W&B and CodeCarbon
# tracking, figures, LoRA healing, CLIP benchmarks.
HEAVY = ("lm_eval", "wandb", "codecarbon", "matplotlib", "peft", "clip_benchmark", "skimage", "sklearn")
# Every job imports these, but later than run.py's imports: transformers as it reads the model's
# shape, pandas and pyarrow as it writes its row (or reads its configuration's earlier rows).
LATER = ("pandas", "pyarrow", "transformers")


@pytest.mark.slow
def test_importing_the_job_imports_no_heavy_library():
    # run.py's own imports: the job's modules, as a job process imports them before Hydra starts
    code = f"import run, sys; print(sorted(m for m in {HEAVY + LATER!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
