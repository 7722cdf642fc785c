"""One row per job, written atomically to its own parquet file under ``results_dir/runs``.

Many jobs on many nodes may write at once: each writes ``runs/<config_hash>/<run_id>.parquet``
through a temporary file and an atomic rename, so no row is lost or half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

# Keys that change where or how a job runs, not what it computes.
NON_SEMANTIC_KEYS = ("results_dir", "cache_dir", "save_model", "force", "capture", "store", "tracking", "hydra")
NON_SEMANTIC_MODEL_KEYS = ("device", "device_map")


def config_hash(cfg: DictConfig) -> str:
    """Hash of the resolved config without the keys in ``NON_SEMANTIC_KEYS``."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in NON_SEMANTIC_KEYS:
        data.pop(key, None)
    for key in NON_SEMANTIC_MODEL_KEYS:
        data.get("model", {}).pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
        pd.DataFrame([{k: _cell(v) for k, v in row.items()}]).to_parquet(tmp, index=False)
        os.replace(tmp, target)
        return target

    def rows_for(self, config_hash_: str) -> pd.DataFrame:
        files = sorted((self.runs / config_hash_).glob("*.parquet"))
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()

    def finished_row(self, config_hash_: str) -> dict | None:
        rows = self.rows_for(config_hash_)
        if rows.empty:
            return None
        done = rows[rows["status"] == "finished"]
        return None if done.empty else done.sort_values("started_at").iloc[-1].to_dict()

    def load(self, latest_per_config: bool = False) -> pd.DataFrame:
        """All rows as one table (columns are the union of the rows' columns)."""
        files = sorted(self.runs.glob("*/*.parquet"))
        if not files:
            return pd.DataFrame()
        table = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        if latest_per_config:
            table = table.sort_values("started_at").groupby("config_hash", as_index=False).tail(1)
        return table.reset_index(drop=True)
