"""The results store: one row per job (:mod:`.row`), one parquet file per row, read back as one
pandas table (:mod:`.store`)."""

from replaceme_exp.results.store import ResultsStore

__all__ = ["ResultsStore"]
