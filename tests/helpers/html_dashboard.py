"""What the unit and e2e tests of html dashboard share: fixtures, builders and constants."""

from __future__ import annotations

from pathlib import Path

from replaceme_exp.results import ResultsStore
from replaceme_exp.results.row import start_row


def store_with_runs(root: Path) -> ResultsStore:
    """A store of a 2x2 sweep (objective x alpha: four finished rows with logs), a failed run and a
    run of another sweep, written through the store API as jobs write them."""
    store = ResultsStore(root)
    runs = [("s1", "ls", 0.0, 30.0), ("s1", "ls", 10.0, 28.0), ("s1", "cosine", 0.0, 33.0)]
    runs += [("s1", "cosine", 10.0, 35.0)]
    for i, (sweep, objective, alpha, ppl) in enumerate(runs + [("s2", "ls", 0.0, 31.0)]):
        settings = {"model": "tiny_llama", "objective": objective, "alpha": alpha, "n_prune": 2}
        row = start_row(f"cfg{i}", f"set{i}", sweep, settings, 1)
        job_dir = root / "hydra" / "multirun" / sweep / str(i)
        job_dir.mkdir(parents=True)
        (job_dir / "run.log").write_text(f"job {row['run_id']} log\n")
        row.update(status="finished", sweep_name="sweep", cuts=[[2, 4]], ppl_heldout=ppl, ppl_heldout_baseline=20.0,
                   time_total_s=10.0 + i, job_dir=str(job_dir))  # fmt: skip
        store.write(row)
    failed = start_row("cfg9", "set9", "s1", {"model": "tiny_llama", "objective": "ls", "alpha": -1.0}, 1)
    store.write({**failed, "status": "failed", "error": "ConfigError: alpha=-1: must be >= 0"})
    return store
