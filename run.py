"""Entry point: one job, or a sweep with ``-m``.

python run.py                                   # the default job (offline, SmolLM2)
python run.py cuts='[[20,28]]' objective=identity
python run.py -m objective=ls,identity alpha=0,10
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from replaceme_exp.job import run_recorded
from replaceme_exp.tracking.sweep_summary import write_job_status

log = logging.getLogger("replaceme_exp")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_id = Path(hc.sweep.dir).name if multirun else Path(hc.run.dir).name
    overrides = [o for o in hc.overrides.task if not o.startswith(("results_dir=", "hydra"))]
    row = run_recorded(
        cfg,
        sweep_id=sweep_id,
        raise_on_failure=False,
        job_dir=hc.runtime.output_dir,
        run_name=",".join(overrides) or "default",
    )
    write_job_status(hc.runtime.output_dir, row, ",".join(overrides))
    if row["status"] == "failed" and not multirun:
        log.error("failed: %s", row["error"])
        sys.exit(1)
    if row["status"] == "finished":
        log.info(
            "cuts=%s ppl_heldout=%.3f (unpruned %.3f) cos_dist %.4f -> %.4f",
            row["cuts"],
            row["ppl_heldout"],
            row["ppl_heldout_baseline"],
            row["cos_dist_before"],
            row["cos_dist_after"],
        )
    return row.get("ppl_heldout")


if __name__ == "__main__":
    main()
