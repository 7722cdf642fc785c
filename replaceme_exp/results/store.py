"""One row per job, written atomically to its own parquet file under ``results_dir/runs``.

Many jobs on many nodes may write at once: each writes ``runs/<config_hash>/<run_id>.parquet``
through a temporary file and an atomic rename, so no row is lost or half-written.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _cell(value: Any) -> Any:
    """Parquet-friendly cell: lists and dicts as JSON text."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


class ResultsStore:
    def __init__(self, results_dir: str | os.PathLike):
        self.root = Path(results_dir)
        self.runs = self.root / "runs"

    def write(self, row: dict) -> Path:
        """Write one row atomically; returns its path."""
        directory = self.runs / row["config_hash"]
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{row['run_id']}.parquet"
        tmp = directory / f".{row['run_id']}.parquet.tmp"
        try:
            pd.DataFrame([{k: _cell(v) for k, v in row.items()}]).to_parquet(tmp, index=False)
            os.replace(tmp, target)
        finally:  # a full disk leaves no partial file behind
            tmp.unlink(missing_ok=True)
        return target

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
