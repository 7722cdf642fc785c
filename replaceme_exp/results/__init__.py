"""The results store: one parquet file per job, read back as one pandas table."""

from replaceme_exp.results.identity import config_hash, setting_hash
from replaceme_exp.results.store import ResultsStore

__all__ = ["ResultsStore", "config_hash", "setting_hash"]
