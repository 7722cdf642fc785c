"""Entry point: one job, or a sweep with ``-m``.

python run.py                                   # the default job (offline, SmolLM2)
python run.py cuts='[[20,28]]' objective=identity
python run.py -m objective=ls,identity alpha=0,10
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from replaceme_exp.plugins import PluginError

try:  # the methods, then the installed plugins (replaceme_exp.plugins): one that fails to import is one line
    import replaceme_exp.methods  # noqa: F401
except PluginError as err:
    sys.exit(f"error: {err}")

from replaceme_exp.runtime import JobInterrupted, run_recorded  # noqa: E402
from replaceme_exp.runtime.composition import one_line_composition_errors
from replaceme_exp.runtime.job_summary import sample_lines, summary_line
from replaceme_exp.runtime.log_files import prefix_console
from replaceme_exp.runtime.ranks import follow, follower_overrides, leave, start_ranks
from replaceme_exp.runtime.sweep_name import sweep_name, sweep_overrides
from replaceme_exp.runtime.sweep_summary import write_job_status
from replaceme_exp.runtime.targets import guard_hydra_targets
from replaceme_exp.runtime.threads import set_torch_threads

log = logging.getLogger("replaceme_exp")


def sweep_params(hc) -> str:
    """The sweep a template or the command line declares (``hydra.sweeper.params``), as text; "" when none."""
    params = OmegaConf.to_container(hc.sweeper, resolve=False).get("params") or {}
    return " ".join(f"{k}={v}" for k, v in params.items())


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    if not multirun and (params := sweep_params(hc)):
        log.error("%s is a sweep (%s): launch it with -m", sweep_name(dict(hc.runtime.choices), False), params)
        sys.exit(2)
    if multirun and "joblib" in str(hc.launcher.get("_target_", "")).lower():  # jobs share the console
        prefix_console(f"[job {hc.job.num}] ")
    sweep_id = Path(hc.sweep.dir).name if multirun else Path(hc.run.dir).name
    # As typed: an override may hold an interpolation that does not resolve (the job refuses it in one line).
    task = OmegaConf.to_container(hc.overrides.task, resolve=False)
    overrides = [o for o in task if not o.startswith(("results_dir=", "hydra"))]
    set_torch_threads()
    if (ranks := start_ranks(cfg)) is not None:
        # a sweep's job under the SLURM presets with several tasks (hydra.launcher.tasks_per_node) is one job
        # over its tasks; any other sweep runs one process per job
        if multirun and "submitit" not in str(hc.launcher.get("_target_", "")).lower():
            log.error("a sweep (-m) runs one process per job: launch it without torchrun / srun")
            sys.exit(2)
        if ranks.rank != 0:
            code = follow(cfg, hc.runtime.output_dir)
            leave()
            if code:
                sys.exit(code)
            return None
    try:
        row = run_recorded(
            cfg,
            sweep_id=sweep_id,
            raise_on_failure=False,
            job_dir=hc.runtime.output_dir,
            run_name=",".join(overrides) or "default",
            sweep_name=sweep_name(
                dict(hc.runtime.choices), multirun, sweep_overrides(hc.sweep.dir) if multirun else None
            ),
            overrides=task,
        )
    except JobInterrupted as stopped:  # SIGTERM / SIGINT: the row is written; the sweep stops here
        write_job_status(hc.runtime.output_dir, stopped.row, ",".join(overrides))
        log.error(summary_line(stopped.row))
        sys.exit(128 + (signal.SIGINT if "SIGINT" in str(stopped) else signal.SIGTERM))
    finally:
        leave()
    given_alpha = OmegaConf.select(cfg, "alpha", default=None, throw_on_resolution_failure=False)
    write_job_status(hc.runtime.output_dir, row, ",".join(overrides), given_alpha)
    for line in [summary_line(row), *(sample_lines(row) if row["status"] != "skipped" else [])]:
        (log.error if row["status"] == "failed" else log.info)(line)
    if row["status"] == "failed" and not multirun:
        sys.exit(1)
    return row.get("ppl_heldout")


if __name__ == "__main__":
    sys.argv += follower_overrides(sys.argv[1:])  # a rank other than 0: its own log file, nothing else
    guard_hydra_targets()
    try:
        with one_line_composition_errors():
            main()
    finally:
        # At exit the interpreter's last garbage collections walk every object torch, transformers and
        # the job left behind (about 1 s on 2 cores), which the process's end frees anyway; exit
        # handlers (W&B, logging) still run.
        gc.freeze()
