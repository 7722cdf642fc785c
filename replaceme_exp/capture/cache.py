"""Content-addressed cache of capture results on disk.

Keys are hashes of (model weights by content, calibration token ids, what was captured, and a
version of the code's semantics for each kind of entry): jobs that differ only in ``alpha``,
``regularizer`` or ``objective`` find the statistics of their cut here. Every entry carries its
whole key and a checksum over key and tensors (:func:`~replaceme_exp.storage.write_keyed_tensors`):
an entry copied over another's file name, corrupt or from an older version is reported, removed
and recomputed, never used. Bump a kind's version in ``CACHE_VERSIONS`` whenever the code changes
what that kind of entry holds. ``refresh=True`` (``force=true``) recomputes and overwrites instead
of reading. ``hits`` lists the kinds served. The cache only saves time: when an entry cannot be
written (a full disk), the job goes on without the cache.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from replaceme_exp.capture import distributed
from replaceme_exp.capture.accumulator import Accumulator
from replaceme_exp.capture.folds import FOLD_ASSIGNMENT, FoldedStats
from replaceme_exp.capture.similarity import Similarities
from replaceme_exp.capture.statistics import Cut, LinearStats
from replaceme_exp.storage import (
    content_key,
    file_lock,
    read_keyed_tensors,
    remove_dead_temporaries,
    write_keyed_tensors,
    write_optional,
)

log = logging.getLogger(__name__)

# Semantics version per kind of entry: bump when the code changes what an entry holds.
CACHE_VERSIONS = {
    "distances": 2,
    "layer_distances": 2,
    "linear": 2,
    "linear_folds": 1,
    "similarity": 1,
}

_swept: set[Path] = set()  # cache folders whose killed writers' leftovers this process removed


class StatisticsCache:
    """The entries of one model's captures over one data set; ``last_state`` (``capture.last_state``)
    enters every key when it is not ``block_output`` (the keys entries had before it existed)."""

    def __init__(
        self,
        root: str | os.PathLike,
        model_hash: str,
        data_hash: str,
        enabled: bool = True,
        refresh: bool = False,
        last_state: str = "block_output",
    ):
        self.root = Path(root)
        self.model_hash, self.data_hash, self.enabled, self.refresh = model_hash, data_hash, enabled, refresh
        self.captured = {} if last_state == "block_output" else {"last_state": last_state}
        self.writable = enabled  # False after a write failed (a full disk): no more attempts
        self.hits: list[str] = []
        if enabled and self.root not in _swept:
            _swept.add(self.root)
            remove_dead_temporaries(self.root)

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Held while a job looks up, computes and stores this cache's entries: an exclusive lock
        across processes and nodes (``<root>/locks/``, one per model, data set and captured state),
        so that a second job needing the same capture waits, then reads what the first one stored
        instead of computing it again. Nothing to hold when the cache is off, nor for the other ranks
        of a job of several processes (rank 0 holds it for them: they read what it reads)."""
        if not self.enabled or not distributed.is_leader():
            yield
            return
        name = content_key({"model": self.model_hash, "data": self.data_hash, **self.captured}, 24)

        def waiting() -> None:
            log.info("another job is capturing over the same model and data; waiting for its statistics")

        with file_lock(self.root / "locks" / f"{name}.lock", waiting):
            yield

    def _entry(self, kind: str, version: int | None = None, **what) -> tuple[Path, dict]:
        """The file of the entry of ``kind`` (at ``version``; None: ``CACHE_VERSIONS``'s) for ``what``
        and its whole key."""
        version = CACHE_VERSIONS[kind] if version is None else version
        key = {"model": self.model_hash, "data": self.data_hash, "kind": kind, "version": version}
        key.update(**self.captured, **what)
        return self.root / f"{kind}-{content_key(key, 24)}.pt", key

    def _load(self, entry: tuple[Path, dict]) -> dict | None:
        """The tensors of ``entry`` if it exists, holds its own key and its checksum holds; else
        None (a bad entry is reported with its path, removed and recomputed by the caller). In a
        capture shared by several ranks, rank 0 reads and every rank gets what it read (so all of
        them capture, or none)."""
        path, key = entry
        if not self.enabled or self.refresh:
            return None
        read = distributed.is_leader()
        payload = read_keyed_tensors(path, key, "statistics cache entry") if read else None
        if distributed.shared() is not None:
            payload = distributed.from_leader(payload, "sharing a statistics cache entry")
        if payload is not None:
            self.hits.append(key["kind"])
        return payload

    def _save(self, entry: tuple[Path, dict], payload: dict) -> None:
        """Write ``entry`` (rank 0 alone in a job of several processes)."""
        path, key = entry
        if (
            self.writable
            and distributed.is_leader()
            and not write_optional("statistics cache entry", path, lambda: write_keyed_tensors(path, key, payload))
        ):
            self.writable = False

    def restore(self, accumulator: Accumulator) -> bool:
        """Whether an entry of ``accumulator``'s kind, version and identity was found; ``accumulator``
        then holds it (:meth:`~replaceme_exp.capture.accumulator.Accumulator.restore`)."""
        payload = self._load(self._accumulator_entry(accumulator))
        if payload is not None:
            accumulator.restore(payload)
        return payload is not None

    def store(self, accumulator: Accumulator) -> None:
        """Keep what ``accumulator`` holds under its kind, version and identity."""
        state = {name: tensor.detach().cpu() for name, tensor in accumulator.state().items()}
        self._save(self._accumulator_entry(accumulator), state)

    def _accumulator_entry(self, accumulator: Accumulator) -> tuple[Path, dict]:
        kind = accumulator.kind
        if not kind or kind in CACHE_VERSIONS:
            raise ValueError(f"{type(accumulator).__name__}.kind={kind!r}: name a kind of entry of its own")
        return self._entry(kind, accumulator.version, **accumulator.identity())

    def get_distances(self, length: int, criterion: str) -> dict[Cut, float] | None:
        """Distances of every candidate cut of ``length`` blocks under ``criterion`` (e.g.
        ``cosine/all``, ``ls_residual/alpha=0.0``)."""
        payload = self._load(self._entry("distances", length=length, criterion=criterion))
        return (
            None
            if payload is None
            else {tuple(c): d for c, d in zip(payload["cuts"].tolist(), payload["distances"].tolist())}
        )

    def put_distances(self, length: int, criterion: str, distances: dict[Cut, float]) -> None:
        cuts = sorted(distances)
        self._save(
            self._entry("distances", length=length, criterion=criterion),
            {"cuts": torch.tensor(cuts), "distances": torch.tensor([distances[c] for c in cuts], dtype=torch.float64)},
        )

    def get_layer_distances(self) -> list[list[float]] | None:
        """The (num_layers, num_layers) mean cosine distances between block outputs."""
        payload = self._load(self._entry("layer_distances"))
        return None if payload is None else payload["distances"].tolist()

    def put_layer_distances(self, distances: list[list[float]]) -> None:
        self._save(self._entry("layer_distances"), {"distances": torch.tensor(distances, dtype=torch.float64)})

    def get_similarities(self, cut: Cut, criterion: str) -> Similarities | None:
        """The linear CKA, mean CCA and PWCCA of ``cut`` and their token count, under ``criterion``
        (the ridge, the products' precision)."""
        payload = self._load(self._entry("similarity", cut=list(cut), criterion=criterion))
        if payload is None:
            return None
        values = {name: payload[name].item() for name in ("linear_cka", "mean_cca", "pwcca")}
        return Similarities(**values, n_tokens=int(payload["n_tokens"]))

    def put_similarities(self, cut: Cut, criterion: str, found: Similarities) -> None:
        values = {
            name: torch.tensor(getattr(found, name), dtype=torch.float64)
            for name in ("linear_cka", "mean_cca", "pwcca")
        }
        self._save(
            self._entry("similarity", cut=list(cut), criterion=criterion),
            {**values, "n_tokens": torch.tensor(found.n_tokens)},
        )

    def _stats_entry(self, cut: Cut, placement: str, tokens: str, precision: str) -> tuple[Path, dict]:
        what = {"cut": list(cut), "placement": placement, "tokens": tokens}
        if precision != "float64":  # float64 entries keep the key they had before precisions existed
            what["precision"] = precision
        return self._entry("linear", **what)

    def get_stats(
        self, cut: Cut, placement: str = "fused", tokens: str = "all", precision: str = "float64"
    ) -> LinearStats | None:
        """The statistics of ``cut`` in ``placement`` over the tokens ``tokens`` selects
        (:meth:`TokenRule.key`), with products taken in ``precision``."""
        p = self._load(self._stats_entry(cut, placement, tokens, precision))
        if p is None:
            return None
        return LinearStats(cut, p["mtm"], p["mtr"], float(p["r_sq"]), int(p["n_tokens"]))

    def put_stats(
        self, stats: LinearStats, placement: str = "fused", tokens: str = "all", precision: str = "float64"
    ) -> None:
        self._save(
            self._stats_entry(stats.cut, placement, tokens, precision),
            {
                "mtm": stats.mtm.cpu(),
                "mtr": stats.mtr.cpu(),
                "r_sq": torch.tensor(stats.r_sq, dtype=torch.float64),
                "n_tokens": torch.tensor(stats.n_tokens),
            },
        )

    def _folded_entry(self, cut: Cut, placement: str, tokens: str, precision: str, folds: int) -> tuple[Path, dict]:
        what = {"cut": list(cut), "placement": placement, "tokens": tokens, "precision": precision}
        return self._entry("linear_folds", **what, folds=folds, assignment=FOLD_ASSIGNMENT)

    def get_folded_stats(
        self, cut: Cut, folds: int, placement: str = "fused", tokens: str = "all", precision: str = "float64"
    ) -> FoldedStats | None:
        """The statistics of ``cut`` per fold of whole sequences (:mod:`replaceme_exp.capture.folds`),
        a kind of entry of its own (never served for, nor from, the plain ``linear`` entries)."""
        p = self._load(self._folded_entry(cut, placement, tokens, precision, folds))
        if p is None:
            return None
        parts = [
            LinearStats(cut, p["mtm"][i], p["mtr"][i], float(p["r_sq"][i]), int(p["n_tokens"][i])) for i in range(folds)
        ]
        return FoldedStats.of(parts)

    def put_folded_stats(
        self, stats: FoldedStats, placement: str = "fused", tokens: str = "all", precision: str = "float64"
    ) -> None:
        folds = stats.folds
        self._save(
            self._folded_entry(stats.cut, placement, tokens, precision, len(folds)),
            {
                "mtm": torch.stack([f.mtm.cpu() for f in folds]),
                "mtr": torch.stack([f.mtr.cpu() for f in folds]),
                "r_sq": torch.tensor([f.r_sq for f in folds], dtype=torch.float64),
                "n_tokens": torch.tensor([f.n_tokens for f in folds]),
            },
        )
