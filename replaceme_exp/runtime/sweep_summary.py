"""The end of a sweep: one table of its jobs (finished / skipped / failed, each failure's one-line
error), what its alphas did (:func:`alpha_notes`), and a non-zero exit when any job failed, after all
of them ran.

Each job leaves ``replaceme_status.json`` in its Hydra job directory (:func:`write_job_status`);
the callback reads them from the sweep directory, so it works with every launcher (local, joblib
workers, SLURM nodes sharing the results folder).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from replaceme_exp.results.row import decode_cell, format_cuts
from replaceme_exp.storage import write_json

log = logging.getLogger("replaceme_exp")

STATUS_FILE = "replaceme_status.json"


STATUS_KEYS = (
    "status",
    "error",
    "failed_stage",
    "run_id",
    "config_hash",
    "cuts",
    "ppl_heldout_baseline",
    "ppl_heldout",
    "avg_acc",
    "rp",
    "time_total_s",
    "objective",
    "alpha",  # as it acted (0 where it cannot act)
    "alpha_scale",
    "alpha_effect",
    "gram_mean_eigenvalue",
    "dtype",
)
# A closed-form T that alpha moved by less than the resolution (machine epsilon) of the weights it is
# fused into (relative, Frobenius) is alpha=0's: rounding the fused weights moves it as much.
ALPHA_TOLERANCE = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def write_job_status(job_dir: str | Path, row: dict, overrides: str, given_alpha: float | None = None) -> None:
    """What the sweep summary needs of one job (``given_alpha``: the ``alpha`` its configuration
    gave, before the job spec decided whether it acts)."""
    status = {"overrides": overrides, "given_alpha": given_alpha, **{k: row.get(k) for k in STATUS_KEYS}}
    write_json(Path(job_dir) / STATUS_FILE, status)


def read_statuses(sweep_dir: str | Path) -> list[dict]:
    """One status per job directory of the sweep (a folder with Hydra's ``.hydra``): a job that
    left no readable status counts as failed."""

    def job_number(p: Path) -> tuple:
        return (0, int(p.name)) if p.name.isdigit() else (1, str(p))

    job_dirs = sorted({p.parent for p in Path(sweep_dir).rglob(".hydra")}, key=job_number)
    statuses = []
    for job_dir in job_dirs:
        try:
            statuses.append(json.loads((job_dir / STATUS_FILE).read_text()))
        except (OSError, ValueError) as err:
            statuses.append({"overrides": str(job_dir), "status": "failed", "error": f"no job status ({err})"})
    return statuses


def _number(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


def summary_lines(statuses: list[dict], n_jobs: int | None = None) -> list[str]:
    """A count line, then a table of the jobs: status, cuts, held-out ppl before -> after, avg_acc,
    rp, time, and the job's overrides (a failed job: its stage and one-line error instead)."""
    counts = {k: sum(s["status"] == k for s in statuses) for k in ("finished", "skipped", "failed")}
    lines = [
        f"sweep: {counts['finished']} finished, {counts['skipped']} skipped, {counts['failed']} failed"
        + (f", {n_jobs - len(statuses)} left no status" if n_jobs and n_jobs > len(statuses) else "")
    ]
    header = f"  {'status':8s} {'cuts':12s} {'ppl before -> after':>22s} {'avg_acc':>7s} {'rp':>6s} {'time':>7s}  job"
    lines.append(header)
    for s in statuses:
        job = s["overrides"] or "default"
        if s["status"] == "failed":
            where = f" in {s['failed_stage']}" if s.get("failed_stage") else ""
            error = str(s.get("error") or "").splitlines()[0] if s.get("error") else ""
            lines.append(f"  {'failed':8s} {job}: failed{where}: {error}")
            continue
        ppl = f"{_number(s.get('ppl_heldout_baseline'), '.2f')} -> {_number(s.get('ppl_heldout'), '.2f')}"
        time_s = _number(s.get("time_total_s"), ".0f")
        lines.append(
            f"  {s['status']:8s} {format_cuts(s.get('cuts'), '—'):12s} {ppl:>22s} "
            f"{_number(s.get('avg_acc'), '.3f'):>7s} "
            f"{_number(s.get('rp'), '.3f'):>6s} {time_s + ' s' if time_s != '—' else '—':>7s}  {job}"
        )
    return lines + alpha_notes(statuses)


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _per_cut(value) -> dict:
    """A per-cut column (``{"4-6": 0.3}``) as a mapping, whether the job's row held it as one or a
    skipped job's finished row, read back from parquet, as JSON text; {} when it has none."""
    value = decode_cell(value)
    return value if isinstance(value, dict) else {}


def alpha_notes(statuses: list[dict]) -> list[str]:
    """What the sweep's alphas did, per objective: jobs whose given alpha > 0 ran as alpha 0 (an
    objective that takes no alpha, such as identity: T = I; or ``regularizer=none``); and for closed
    forms, how far each alpha moved T from alpha 0's (``alpha_effect``, measured by the job:
    ``||T(alpha) - T(0)||_F / ||T(0)||_F``), called nothing when below the resolution of the weights
    T is fused into (:data:`ALPHA_TOLERANCE` of the model's dtype)."""
    lines = []
    ignored: dict[str, set] = {}
    measured: dict[tuple[str, float], tuple[float, float | None, str]] = {}
    for s in statuses:
        if s.get("status") not in ("finished", "skipped"):
            continue
        objective, given, acted = s.get("objective"), _float(s.get("given_alpha")), _float(s.get("alpha"))
        if given and acted == 0:
            reason = "takes no alpha" if s.get("alpha_scale") is None else "has regularizer=none"
            ignored.setdefault(f"objective={objective} {reason}", set()).add(given)
        effects = [v for v in _per_cut(s.get("alpha_effect")).values() if _float(v) is not None]
        if acted and effects:
            scales = [_float(v) for v in _per_cut(s.get("gram_mean_eigenvalue")).values() if _float(v) is not None]
            measured[(str(objective), acted)] = (max(effects), min(scales) if scales else None, str(s.get("dtype")))
    for what, alphas in ignored.items():
        values = ",".join(f"{a:g}" for a in sorted(alphas))
        lines.append(f"alpha does nothing for {what}: its jobs at alpha={values} are its alpha=0 configuration")
    for (objective, alpha), (effect, scale, dtype) in sorted(measured.items()):
        against = f"; mean eigenvalue of M^T M: {scale:.3g}" if scale is not None else ""
        tolerance = ALPHA_TOLERANCE.get(dtype, ALPHA_TOLERANCE["float32"])
        if effect < tolerance:
            lines.append(
                f"alpha={alpha:g} does nothing for objective={objective}: it moved T by {effect:.1e} relative to "
                f"alpha=0 (measured), below the resolution of {dtype} weights ({tolerance:.1e}): alpha is added to "
                f"M^T M summed over the calibration tokens{against}"
            )
        else:
            lines.append(
                f"alpha={alpha:g} moved objective={objective}'s T by {effect:.1e} relative to alpha=0 "
                f"(measured{against})"
            )
    return lines


class SweepSummary(Callback):
    """Hydra callback (``hydra.callbacks.sweep_summary``)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        statuses = read_statuses(config.hydra.sweep.dir)
        try:
            lines = summary_lines(statuses)
        except Exception:  # noqa: BLE001 - Hydra would turn it into a warning and lose the exit code below
            log.exception("the sweep's summary table failed (the project's bug); its jobs' statuses are in %s",
                          config.hydra.sweep.dir)  # fmt: skip
            lines = []
        for line in lines:
            log.info(line)
        failed = [s for s in statuses if s.get("status") == "failed"]
        if failed:
            log.error("%d of %d jobs failed", len(failed), len(statuses))
            sys.exit(1)
