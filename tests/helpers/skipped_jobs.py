"""What the unit, integration and e2e tests of skipped jobs share: fixtures, builders and constants."""

from __future__ import annotations

from replaceme_exp.results.row import skip_row


def run(run_id: str, config_hash: str, sweep_id: str, **values) -> dict:
    """A finished pruning row as a job writes it (held-out perplexity only, as eval=quick)."""
    row = dict(
        run_id=run_id, config_hash=config_hash, setting_hash=config_hash, status="finished", run_seq=1,
        started_at=f"2026-01-01T00:00:{len(run_id):02d}", sweep_id=sweep_id, sweep_name="sweep", job="prune",
        model="tiny_llama", eval="quick", calibration="pydoc", seed=42, n_prune=2, cuts=[[3, 5]],
        method="ReplaceMe LS", objective="ls", selection_metric="cosine", alpha=0.0, regularizer="none",
        ppl_heldout=40.0, ppl_heldout_baseline=21.0,
    )  # fmt: skip
    row.update(values)
    return row


def skipped(finished: dict, sweep_id: str, job_dir=None) -> dict:
    """The row a job of ``sweep_id`` writes when ``finished`` makes it skip."""
    return skip_row(finished, sweep_id, "sweep", str(job_dir) if job_dir else None)
