"""``make clean-failed RESULTS=dir``: remove the failed runs from a results store.

A dry run by default: it lists what it would remove; with ``--confirm`` (``CONFIRM=1``) it removes it.
What goes, for each row whose ``status`` is not ``finished`` (failed: stopped, crashed, refused for a
typo; or any other unfinished status):

- its row file (``runs/<config_hash>/<run_id>.parquet``), and the folder when it is left empty;
- its job folder (the Hydra job directory or ``jobs/<run_id>``, with its log and W&B files), when that
  folder lies inside the results directory and no finished row names it;
- for a configuration with no finished row at all, what its runs left: ``models/<config_hash>`` and
  ``transforms/<config_hash>.safetensors``.

Never a finished row, nor anything a finished row points to (its model, its transforms, its job
folder): a failed rerun of a finished configuration loses only its own row and job folder. Nor a
skipped job's row (``skips/``: a job skipped as finished before, which its sweep's report lists):
it is no failure, and no row of ``runs/`` (:meth:`ResultsStore.load` does not read it).

    python -m replaceme_exp.results.cleaning --results results [--confirm]
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from replaceme_exp.results.store import ResultsStore


@dataclass(frozen=True)
class Removal:
    """One path to remove, and why."""

    path: Path
    why: str


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def failed_removals(results_dir: str | Path) -> list[Removal]:
    """What ``clean-failed`` removes from ``results_dir`` (see the module docstring), in order."""
    root = Path(results_dir)
    store = ResultsStore(root)
    table = store.load()
    if table.empty or "status" not in table.columns:
        return []
    finished = table[table["status"] == "finished"]
    unfinished = table[table["status"] != "finished"]
    finished_hashes = set(finished["config_hash"])
    protected = {str(Path(str(p)).resolve()) for p in finished.get("job_dir", pd.Series(dtype=object)).dropna()}
    out: list[Removal] = []
    for row in unfinished.to_dict("records"):
        what = f"{row.get('status')} run {row['run_id']} ({row['config_hash']})"
        path = store.row_path(row)
        if path.is_file():
            out.append(Removal(path, f"row of the {what}"))
        job_dir = row.get("job_dir")
        if isinstance(job_dir, str) and job_dir:
            folder = Path(job_dir)
            inside = _inside(folder, root) and folder.resolve() != root.resolve()
            if inside and str(folder.resolve()) not in protected and folder.is_dir():
                out.append(Removal(folder, f"job folder of the {what}"))
    for config_hash in sorted(set(unfinished["config_hash"]) - finished_hashes):
        for path in (root / "models" / config_hash, root / "transforms" / f"{config_hash}.safetensors"):
            if path.exists():
                out.append(Removal(path, f"left by the unfinished configuration {config_hash}"))
    return out


def remove(removals: list[Removal], results_dir: str | Path) -> int:
    """Remove each path; then the row folders left empty. Returns how many paths were removed."""
    runs = ResultsStore(results_dir).runs
    for removal in removals:
        if removal.path.is_dir():
            shutil.rmtree(removal.path)
        else:
            removal.path.unlink(missing_ok=True)
    for folder in {r.path.parent for r in removals if r.path.parent.parent == runs}:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return len(removals)


def clean_failed(results_dir: str | Path, confirm: bool = False) -> list[str]:
    """The lines ``make clean-failed`` prints: what is (or would be) removed, then a count."""
    removals = failed_removals(results_dir)
    if not removals:
        return [f"no failed run under {Path(results_dir) / 'runs'}: nothing to remove"]
    lines = [f"{'removing' if confirm else 'would remove'} {r.path}  ({r.why})" for r in removals]
    if confirm:
        remove(removals, results_dir)
        lines.append(f"removed {len(removals)} path(s)")
    else:
        lines.append(f"dry run: {len(removals)} path(s) would be removed; run again with CONFIRM=1 to remove them")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--confirm", action="store_true", help="remove (default: list what would be removed)")
    args = parser.parse_args()
    for line in clean_failed(args.results, args.confirm):
        print(line)


if __name__ == "__main__":
    main()
