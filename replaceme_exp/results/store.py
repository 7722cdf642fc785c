"""One row per job, written atomically to its own parquet file under ``results_dir/runs``.

Many jobs on many nodes may write at once: each writes ``runs/<config_hash>/<run_id>.parquet``
through a temporary file and an atomic rename, so no row is lost or half-written.

A job skipped because its configuration already has a finished row is no run: its row
(``status=skipped``, :func:`~replaceme_exp.results.row.skip_row`, pointing at the finished run by
``finished_run_id``) goes to ``skips/<config_hash>/<run_id>.parquet``, the same way, so that a sweep's
report lists every job of the sweep whatever launched it. :meth:`ResultsStore.load` never returns
these rows (``runs/`` holds one row per run); :meth:`ResultsStore.load_skips` does.

Which run of a configuration is its latest is decided by ``run_seq`` (:func:`oldest_first`), a
number each run takes when it starts, under the configuration's lock: 1 + the largest among the
configuration's rows. Wall-clock ``started_at`` is not used for that: a rerun on a node whose clock
is behind would stay hidden behind the row it replaced.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from replaceme_exp.results.row import encode_cell
from replaceme_exp.storage import HOST, atomic_path, left_by_killed_writer, pid_alive, temporary_writer

if TYPE_CHECKING:
    import pandas as pd
else:

    class _Pandas:
        """pandas, imported at its first use: a job reads rows only when some exist and writes its
        own at its end, so its first stage need not wait for the import."""

        def __getattr__(self, name: str):
            import pandas

            return getattr(pandas, name)

    pd = _Pandas()

log = logging.getLogger(__name__)

RUN_SEQ = "run_seq"  # the row's place among its configuration's runs: 1, 2, ... (ResultsStore.next_run_seq)
SKIPPED = "skipped"  # the status of a skipped job's row: no run (it points at the finished one)


class ResultsStore:
    def __init__(self, results_dir: str | os.PathLike):
        self.root = Path(results_dir)
        self.runs = self.root / "runs"
        self.skips = self.root / "skips"

    def write(self, row: dict) -> Path:
        """Write one row atomically (a skipped job's row under ``skips/``, any other under ``runs/``);
        returns its path."""
        target = self.row_path(row)
        with atomic_path(target) as tmp:  # a full disk leaves no partial file behind
            pd.DataFrame([{k: encode_cell(v) for k, v in row.items()}]).to_parquet(tmp, index=False)
        return target

    def row_path(self, row: dict) -> Path:
        """Where ``row`` is (or will be) stored."""
        folder = self.skips if row.get("status") == SKIPPED else self.runs
        return folder / row["config_hash"] / f"{row['run_id']}.parquet"

    def row_files(self, config_hash_: str) -> list[Path]:
        """The files of a configuration's rows (none before its first run)."""
        return sorted((self.runs / config_hash_).glob("*.parquet"))

    def rows_for(self, config_hash_: str) -> pd.DataFrame:
        return _read_rows(self.row_files(config_hash_))

    def next_run_seq(self, config_hash_: str) -> int:
        """The ``run_seq`` of a new run of a configuration: 1 + the largest among its rows (1 for its
        first run, or when its rows predate the column). The caller holds the configuration's lock
        (:func:`replaceme_exp.runtime.locks.config_lock`), so two runs never take the same one."""
        if not self.row_files(config_hash_):  # its first run: no table to read (nor pandas to import)
            return 1
        seqs = _run_seqs(self.rows_for(config_hash_)).dropna()
        return 1 + int(seqs.max()) if not seqs.empty else 1

    def finished_row(self, config_hash_: str) -> dict | None:
        """The latest finished run of a configuration (a later failed rerun does not hide it),
        or None when it has none."""
        if not self.row_files(config_hash_):
            return None
        rows = self.rows_for(config_hash_)
        if rows.empty or "status" not in rows.columns:
            return None
        done = rows[rows["status"] == "finished"]
        return None if done.empty else oldest_first(done).iloc[-1].to_dict()

    def remove_leftovers(self, config_hash_: str) -> list[Path]:
        """Remove the temporary row files (``.<run_id>.parquet.<pid>.tmp``) that killed runs (or
        skipped jobs) of a configuration left in its folders; returns them. The caller holds the
        configuration's lock, so no run of it is writing one; a file named by a live process other
        than this one is kept all the same."""
        removed = []
        folders = (self.runs / config_hash_, self.skips / config_hash_)
        for tmp in (tmp for folder in folders for tmp in folder.glob(".*.parquet.*.tmp")):
            if _written_by_other_live_process(tmp):
                continue
            try:
                tmp.unlink(missing_ok=True)
            except OSError as err:  # e.g. a read-only folder: the job says so before it computes
                log.warning("cannot remove the leftover %s: %s", tmp, err)
                continue
            removed.append(tmp)
        return removed

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

    def load_skips(self) -> pd.DataFrame:
        """The rows of skipped jobs (``skips/``) as one table: each names its job's sweep and, in
        ``finished_run_id``, the run of :meth:`load` it stands for."""
        table = _read_rows(sorted(self.skips.glob("*/*.parquet")))
        return table.reset_index(drop=True)


def _written_by_other_live_process(tmp: Path) -> bool:
    """Whether the writer named in a temporary file's name (``.<name>.<pid>@<host>.tmp``) may still
    be writing it: a live process of this host other than this one, or another host's process."""
    writer = temporary_writer(tmp.name)
    if writer is None:
        return False
    pid, host = writer
    if host not in (None, HOST):
        return not left_by_killed_writer(tmp)
    return pid != os.getpid() and pid_alive(pid)


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


def started_text(table: pd.DataFrame) -> pd.Series:
    """``started_at`` as sortable text ("" where missing: earliest). Wall-clock time: it orders
    runs of different configurations; runs of one configuration are ordered by :func:`oldest_first`."""
    if "started_at" not in table.columns:
        return pd.Series("", index=table.index)
    return table["started_at"].map(lambda v: "" if v is None or (isinstance(v, float) and v != v) else str(v))


def _run_seqs(table: pd.DataFrame) -> pd.Series:
    """``run_seq`` as numbers (NaN for a row written before the column existed)."""
    if RUN_SEQ not in table.columns:
        return pd.Series(float("nan"), index=table.index)
    return pd.to_numeric(table[RUN_SEQ], errors="coerce")


def oldest_first(table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s rows so that, within each configuration, a later run comes after an earlier one:
    by ``run_seq``; rows written before that column existed come before any row with it, ordered
    among themselves by ``started_at``; ties (two runs without a working lock) by ``started_at``,
    then ``run_id``. Rows of different configurations are in no meaningful order relative to each
    other. The one ordering behind every "latest run" (the skip of a finished configuration,
    :func:`latest_finished_per_config`, the reports)."""
    seqs = _run_seqs(table)
    run_ids = table["run_id"].astype(str) if "run_id" in table.columns else pd.Series("", index=table.index)
    keys = pd.DataFrame(
        {"has_seq": seqs.notna().astype(int), "seq": seqs.fillna(0), "started": started_text(table), "run_id": run_ids},
        index=table.index,
    )
    return table.loc[keys.sort_values(["has_seq", "seq", "started", "run_id"], kind="mergesort").index]


def runs_only(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` without skipped jobs' rows (no run: :meth:`ResultsStore.load_skips`)."""
    if "status" not in table.columns:
        return table
    return table[table["status"] != SKIPPED]


def latest_of_each_config(table: pd.DataFrame) -> pd.DataFrame:
    """The latest run (:func:`oldest_first`) of each ``config_hash`` among ``table``'s rows, in
    ``table``'s order; a skipped job's row is no run."""
    table = runs_only(table)
    if table.empty:
        return table
    latest = oldest_first(table).groupby("config_hash", sort=False).tail(1).index
    return table[table.index.isin(latest)]


def latest_finished_per_config(table: pd.DataFrame) -> pd.DataFrame:
    """One row per ``config_hash``: the latest finished one, else the latest one; the rows not
    finished first, then by ``started_at``. A skipped job's row is no run: never one of them."""
    table = runs_only(table)
    if table.empty:
        return table
    finished = (table["status"] == "finished") if "status" in table.columns else pd.Series(False, index=table.index)
    never_finished = ~finished & ~table["config_hash"].isin(set(table.loc[finished, "config_hash"]))
    chosen = pd.concat([latest_of_each_config(table[finished]), latest_of_each_config(table[never_finished])])
    order = pd.DataFrame({"finished": finished.loc[chosen.index].astype(int), "started": started_text(chosen)})
    return chosen.loc[order.sort_values(["finished", "started"], kind="mergesort").index]
