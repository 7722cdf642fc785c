"""Tiny jobs whose results are pinned (``tests/golden/job_results.json``): cuts, distances, perplexities,
losses and every other number a row records, for the main paths through a job (selection metrics,
objectives, token rules, masking, sequential transforms, healing, layer distances, a vision encoder).

``python tests/golden/jobs.py [NAME ...]`` rewrites the JSON (the named jobs only, when names are given)
from the code as it is (written from commit 3c73b47, before the pipeline was restructured; rerun only
when a result changes on purpose). Re-pinned since: ``mse_lbfgs_minibatch``, when the non-Adam solvers
moved to float64 (in float32 its first line search extrapolated 10x on AVX-512 and 5.5x on AVX2)."""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).with_name("job_results.json")
TINY = [
    "model=tiny_llama",
    "calibration=pydoc",
    "n_prune=2",
    "calibration.n_samples=24",
    "calibration.seq_len=64",
    "eval.seq_len=64",
    "eval.max_windows=4",
    "eval=heldout",  # held-out perplexity only: the suite these rows were pinned with (then called quick)
    "eval.text=pydoc_heldout",  # the text these rows were pinned with (before eval.text=documents, 2026-12-07)
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
    "eval.samples=null",
    "save_model=false",
]
JOBS = {
    "ls": [],
    "ls_ridge_explicit_cut": ["alpha=10", "cuts=[[2,4]]"],
    "identity_uidl": ["experiment=uidl_baseline"],
    "cosine_adam": ["objective=cosine", "objective.epochs=2"],
    "mse_lbfgs_minibatch": [
        "objective=mse",
        "objective.solver=lbfgs",
        "solver_schedule=minibatch",
        "objective.epochs=1",
    ],
    "ls_residual_separate": ["selection=ls_residual", "lt_placement=separate", "alpha=1"],
    "cka_rescale_massive": ["selection=cka", "estimation=rescale_massive"],
    "skip_first_diagonal": ["estimation=skip_first", "structure=diagonal"],
    "masked": ["mask_ratio=0.2", "mask_passes=2"],
    "two_sequential": ["num_lts=2", "n_prune=2", "multi_lt=sequential", "merge_consecutive=false"],
    "two_sequential_cosine": [
        "num_lts=2",
        "n_prune=2",
        "multi_lt=sequential",
        "merge_consecutive=false",
        "objective=cosine",
        "objective.epochs=1",
    ],
    "lt_only_healing": [
        "healing=lt_only",
        "healing/data=pydoc",
        "healing.max_steps=3",
        "healing.context_length=64",
        "healing.log_every=1",
    ],
    "layer_distances_orthonormal": ["record_layer_distances=true", "structure=orthonormal"],
    "clip": [
        "model=tiny_clip",
        "calibration=bundled_images",
        "eval=clip_offline",
        "calibration.n_samples=16",
        "calibration.batch_size=8",
        "~calibration.seq_len",
    ],
}
# Columns that say when, where or with which versions a job ran, not what it computed.
VOLATILE = (
    "run_id",
    "sweep_id",
    "started_at",
    "git_sha",
    "job_dir",
    "row_path",
    "wandb_dir",
    "pruned_model_path",
    "time_",
    "seconds",
    "peak_mem_gb",
    "_version",
    "device",
    "energy_kwh",
    "co2_kg",
    "sweep_group",
    "cached_stages",
    "codecarbon",
    "model_fingerprint",
    "config_hash",
    "setting_hash",
    "capture_plan",
)


def volatile(column: str) -> bool:
    return any(v in column for v in VOLATILE)


def plain(value):
    """A cell as JSON-able values (JSON text cells decoded)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def overrides(name: str, results_dir: str) -> list[str]:
    extra = JOBS[name]
    text_only = ("calibration=", "calibration.", "eval.", "eval=")
    base = [o for o in TINY if not (name == "clip" and o.startswith(text_only))]
    base = [o for o in base if not (name == "clip" and o == "model=tiny_llama")]
    return [
        *base,
        *[o for o in extra if not o.startswith("~")],
        f"results_dir={results_dir}",
        f"capture.cache_dir={results_dir}/stats",
    ]


def run(name: str, results_dir: str) -> dict:
    """The row of one pinned job, volatile columns left out."""
    from hydra import compose, initialize_config_dir

    try:
        from replaceme_exp.runtime import run_recorded
    except ImportError:  # the code before the pipeline was restructured
        from replaceme_exp.job import run_recorded

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides(name, results_dir))
    row = run_recorded(cfg, sweep_id="golden")
    assert row["status"] == "finished", row.get("error")
    return {k: plain(v) for k, v in sorted(row.items()) if not volatile(k)}


def main(names: list[str]) -> None:
    """Re-pins the jobs ``names`` (all of them when empty), keeping the other pinned rows."""
    unknown = sorted(set(names) - set(JOBS))
    if unknown:
        sys.exit(f"unknown golden jobs {unknown}: choose among {sorted(JOBS)}")
    out = json.loads(PINNED.read_text()) if names else {}
    for name in names or JOBS:
        with tempfile.TemporaryDirectory() as results_dir:
            out[name] = run(name, results_dir)
            print(name, "done", file=sys.stderr)
    PINNED.write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1:])
