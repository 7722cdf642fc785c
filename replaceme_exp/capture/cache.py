"""Content-addressed cache of capture results on disk.

Keys are hashes of (model weights by content, calibration token ids, what was captured, and a
version of the code's semantics for each kind of entry): jobs that differ only in ``alpha``,
``regularizer`` or ``objective`` find the statistics of their cut here. Bump a kind's version in
``CACHE_VERSIONS`` whenever the code changes what that kind of entry holds. ``refresh=True``
(``force=true``) recomputes and overwrites instead of reading. ``hits`` lists the kinds served.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from replaceme_exp.capture.similarity import Similarities
from replaceme_exp.capture.statistics import Cut, LinearStats
from replaceme_exp.storage import atomic_path, content_key

log = logging.getLogger(__name__)


def payload_digest(payload: dict) -> str:
    """SHA-256 over an entry's tensors (names, dtypes, shapes and bytes), verified on read."""
    h = hashlib.sha256()
    for name in sorted(payload):
        tensor = payload[name].detach().cpu().contiguous()
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return h.hexdigest()


# Semantics version per kind of entry: bump when the code changes what an entry holds.
CACHE_VERSIONS = {"distances": 2, "layer_distances": 2, "linear": 2, "similarity": 1}


class StatisticsCache:
    def __init__(
        self, root: str | os.PathLike, model_hash: str, data_hash: str, enabled: bool = True, refresh: bool = False
    ):
        self.root = Path(root)
        self.model_hash, self.data_hash, self.enabled, self.refresh = model_hash, data_hash, enabled, refresh
        self.hits: list[str] = []

    def _path(self, kind: str, **what) -> Path:
        key = {"model": self.model_hash, "data": self.data_hash, "kind": kind, "version": CACHE_VERSIONS[kind], **what}
        return self.root / f"{kind}-{content_key(key, 24)}.pt"

    def _load(self, path: Path):
        """The entry at ``path`` if it exists and its checksum holds; a corrupt or truncated entry
        is reported with its path, removed and recomputed by the caller (None), never used."""
        if not self.enabled or self.refresh or not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
            stored = payload.pop("_sha256", None)
            if stored != payload_digest(payload):
                raise ValueError("checksum mismatch")
        except Exception as err:  # noqa: BLE001 - unpickling errors of a truncated file vary
            log.warning("corrupt cache entry %s (%s): removed, recomputing", path, err)
            path.unlink(missing_ok=True)
            return None
        self.hits.append(path.name.split("-")[0])
        return payload

    def _save(self, path: Path, payload) -> None:
        if not self.enabled:
            return
        with atomic_path(path) as tmp:
            torch.save({**payload, "_sha256": payload_digest(payload)}, tmp)

    def get_distances(self, length: int, criterion: str) -> dict[Cut, float] | None:
        """Distances of every candidate cut of ``length`` blocks under ``criterion`` (e.g.
        ``cosine/all``, ``ls_residual/alpha=0.0``)."""
        payload = self._load(self._path("distances", length=length, criterion=criterion))
        return (
            None
            if payload is None
            else {tuple(c): d for c, d in zip(payload["cuts"].tolist(), payload["distances"].tolist())}
        )

    def put_distances(self, length: int, criterion: str, distances: dict[Cut, float]) -> None:
        cuts = sorted(distances)
        self._save(
            self._path("distances", length=length, criterion=criterion),
            {"cuts": torch.tensor(cuts), "distances": torch.tensor([distances[c] for c in cuts], dtype=torch.float64)},
        )

    def get_layer_distances(self) -> list[list[float]] | None:
        """The (num_layers, num_layers) mean cosine distances between block outputs."""
        payload = self._load(self._path("layer_distances"))
        return None if payload is None else payload["distances"].tolist()

    def put_layer_distances(self, distances: list[list[float]]) -> None:
        self._save(self._path("layer_distances"), {"distances": torch.tensor(distances, dtype=torch.float64)})

    def get_similarities(self, cut: Cut, criterion: str) -> Similarities | None:
        """The linear CKA, mean CCA and PWCCA of ``cut`` and their token count, under ``criterion``
        (the ridge, the products' precision)."""
        payload = self._load(self._path("similarity", cut=list(cut), criterion=criterion))
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
            self._path("similarity", cut=list(cut), criterion=criterion),
            {**values, "n_tokens": torch.tensor(found.n_tokens)},
        )

    def _stats_path(self, cut: Cut, placement: str, tokens: str, precision: str) -> Path:
        what = {"cut": list(cut), "placement": placement, "tokens": tokens}
        if precision != "float64":  # float64 entries keep the key they had before precisions existed
            what["precision"] = precision
        return self._path("linear", **what)

    def get_stats(
        self, cut: Cut, placement: str = "fused", tokens: str = "all", precision: str = "float64"
    ) -> LinearStats | None:
        """The statistics of ``cut`` in ``placement`` over the tokens ``tokens`` selects
        (:meth:`TokenRule.key`), with products taken in ``precision``."""
        p = self._load(self._stats_path(cut, placement, tokens, precision))
        if p is None:
            return None
        return LinearStats(cut, p["mtm"], p["mtr"], float(p["r_sq"]), int(p["n_tokens"]))

    def put_stats(
        self, stats: LinearStats, placement: str = "fused", tokens: str = "all", precision: str = "float64"
    ) -> None:
        self._save(
            self._stats_path(stats.cut, placement, tokens, precision),
            {
                "mtm": stats.mtm.cpu(),
                "mtr": stats.mtr.cpu(),
                "r_sq": torch.tensor(stats.r_sq, dtype=torch.float64),
                "n_tokens": torch.tensor(stats.n_tokens),
            },
        )
