"""The results store: one parquet file per job, read back as one pandas table."""

from replaceme_exp.results.store import ResultsStore, config_hash

__all__ = ["ResultsStore", "config_hash"]
