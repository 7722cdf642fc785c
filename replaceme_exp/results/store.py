"""One row per job, written atomically to its own parquet file under ``results_dir/runs``.

Many jobs on many nodes may write at once: each writes ``runs/<config_hash>/<run_id>.parquet``
through a temporary file and an atomic rename, so no row is lost or half-written.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from replaceme_exp.results.row import encode_cell
from replaceme_exp.storage import atomic_path

log = logging.getLogger(__name__)


class ResultsStore:
    def __init__(self, results_dir: str | os.PathLike):
        self.root = Path(results_dir)
        self.runs = self.root / "runs"

    def write(self, row: dict) -> Path:
        """Write one row atomically; returns its path."""
        target = self.row_path(row)
        with atomic_path(target) as tmp:  # a full disk leaves no partial file behind
            pd.DataFrame([{k: encode_cell(v) for k, v in row.items()}]).to_parquet(tmp, index=False)
        return target

    def row_path(self, row: dict) -> Path:
        """Where ``row`` is (or will be) stored."""
        return self.runs / row["config_hash"] / f"{row['run_id']}.parquet"

    def rows_for(self, config_hash_: str) -> pd.DataFrame:
        return _read_rows(sorted((self.runs / config_hash_).glob("*.parquet")))

    def finished_row(self, config_hash_: str) -> dict | None:
        """The latest finished run of a configuration (a later failed rerun does not hide it),
        or None when it has none."""
        rows = self.rows_for(config_hash_)
        if rows.empty or "status" not in rows.columns:
            return None
        done = rows[rows["status"] == "finished"]
        return None if done.empty else _by_start(done).iloc[-1].to_dict()

    def load(self, latest_per_config: bool = False) -> pd.DataFrame:
        """All rows as one table (columns are the union of the rows' columns). With
        ``latest_per_config``, one row per config hash: its latest finished run (a later failed
        or unfinished rerun never hides it), or its latest row when none finished."""
        table = _read_rows(sorted(self.runs.glob("*/*.parquet")))
        if table.empty:
            return table
        if latest_per_config:
            table = latest_finished_per_config(table)
        return table.reset_index(drop=True)


def _read_rows(files: list[Path]) -> pd.DataFrame:
    """The rows of ``files`` as one table; an unreadable file (truncated, empty, not parquet) is
    skipped with a warning naming it, so one broken file never hides the others."""
    frames = []
    for file in files:
        try:
            frames.append(pd.read_parquet(file))
        except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a broken file
            log.warning("skipping unreadable row file %s: %s", file, err)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _started(table: pd.DataFrame) -> pd.Series:
    """``started_at`` as sortable text ("" where missing: earliest)."""
    if "started_at" not in table.columns:
        return pd.Series("", index=table.index)
    return table["started_at"].map(lambda v: "" if v is None or (isinstance(v, float) and v != v) else str(v))


def _by_start(table: pd.DataFrame) -> pd.DataFrame:
    return table.loc[_started(table).sort_values(kind="mergesort").index]


def latest_finished_per_config(table: pd.DataFrame) -> pd.DataFrame:
    """One row per ``config_hash``: the latest finished one, else the latest one."""
    if table.empty:
        return table
    finished = (table["status"] == "finished") if "status" in table.columns else pd.Series(False, index=table.index)
    order = pd.DataFrame({"finished": finished.astype(int), "started": _started(table)}, index=table.index)
    order = order.sort_values(["finished", "started"], kind="mergesort")
    return table.loc[order.index].groupby("config_hash", sort=False).tail(1)
