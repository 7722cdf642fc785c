"""Which blocks to cut: candidate cuts, validation of explicit cuts, and selection by distance.

Cuts are half-open ``(start, end)`` with ``1 <= start < end <= num_layers`` (see DESIGN.md).
"""

from __future__ import annotations

from typing import Any

from replaceme_exp.config.depth import blocks_to_prune
from replaceme_exp.errors import ConfigError

Cut = tuple[int, int]


def cut_length(n_prune: int | float, num_lts: int, num_layers: int) -> int:
    """Blocks per transform; validates ``n_prune`` (blocks, or a fraction of the depth) and
    ``num_lts`` against the model depth."""
    if not isinstance(num_lts, int) or num_lts < 1:
        raise ConfigError("num_lts", num_lts, "must be a positive integer")
    n_prune = blocks_to_prune(n_prune, num_layers)
    if n_prune > num_layers - 1:
        raise ConfigError(
            "n_prune", n_prune, f"the model has {num_layers} blocks; at most {num_layers - 1} can be removed"
        )
    if n_prune % num_lts:
        raise ConfigError(
            "num_lts", num_lts, f"must divide n_prune={n_prune} (each transform replaces n_prune/num_lts blocks)"
        )
    length = n_prune // num_lts
    if num_lts * length > num_layers - 1:
        raise ConfigError("num_lts", num_lts, f"{num_lts} cuts of {length} blocks do not fit in {num_layers} blocks")
    return length


def candidate_cuts(num_layers: int, length: int) -> list[Cut]:
    """Every cut of ``length`` blocks: ``(start, start + length)`` for start in 1..num_layers-length."""
    return [(start, start + length) for start in range(1, num_layers - length + 1)]


def validate_cuts(cuts: Any, num_layers: int, merge_consecutive: bool = True, touching: str = "apart") -> list[Cut]:
    """Explicit ``cuts`` from the config as sorted tuples; clear errors for impossible ones.

    Cuts that touch (``end == next start``) are joined when ``merge_consecutive``; otherwise
    they are refused (``touching="apart"``: the second transform's fusion target, block
    ``end - 1``, is removed) or kept (``"compose"``: see :func:`composed_cuts`).
    """
    if not isinstance(cuts, (list, tuple)) or not cuts:
        raise ConfigError("cuts", cuts, "give a non-empty list of [start, end) pairs, e.g. cuts='[[20,28]]'")
    parsed: list[Cut] = []
    for cut in cuts:
        if not isinstance(cut, (list, tuple)) or len(cut) != 2 or not all(isinstance(v, int) for v in cut):
            raise ConfigError("cuts", cuts, f"{cut!r} is not a [start, end) pair of integers")
        start, end = int(cut[0]), int(cut[1])
        if not 1 <= start < end <= num_layers:
            raise ConfigError("cuts", cuts, f"[{start}, {end}) is outside 1 <= start < end <= num_layers={num_layers}")
        parsed.append((start, end))
    parsed.sort()
    for (s1, e1), (s2, e2) in zip(parsed, parsed[1:]):
        if s2 < e1:
            raise ConfigError("cuts", cuts, f"[{s1}, {e1}) and [{s2}, {e2}) overlap")
        if s2 == e1 and not merge_consecutive and touching != "compose":
            raise ConfigError(
                "cuts",
                cuts,
                f"[{s1}, {e1}) and [{s2}, {e2}) touch: block {s2 - 1}, which would take the second transform, "
                f"is removed by the first; give [{s1}, {e2}), set merge_consecutive=true or touching_cuts=compose",
            )
    return merge_consecutive_cuts(parsed) if merge_consecutive else parsed


def merge_consecutive_cuts(cuts: list[Cut]) -> list[Cut]:
    """Join cuts where one ends where the next starts (one transform for the joined run)."""
    merged: list[Cut] = []
    for start, end in sorted(cuts):
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def select_cuts(
    distances: dict[Cut, float], num_lts: int, merge_consecutive: bool, touching: str = "apart"
) -> list[Cut]:
    """The ``num_lts`` non-overlapping cuts of smallest distance, taken greedily in order of
    distance (ties broken by the earlier start); joined when consecutive and ``merge_consecutive``.
    Without merging, touching cuts count as overlapping (``touching="apart"``: each transform
    needs its fusion target, block ``start - 1``, to survive) or may touch (``"compose"``, the
    official ``select_non_overlapping_blocks``). Returns the cuts sorted by start."""
    gap = 0 if merge_consecutive or touching == "compose" else 1
    chosen: list[Cut] = []
    for cut in sorted(distances, key=lambda c: (distances[c], c)):
        if all(cut[1] + gap <= s or e + gap <= cut[0] for s, e in chosen):
            chosen.append(cut)
            if len(chosen) == num_lts:
                break
    if len(chosen) < num_lts:
        raise ConfigError("num_lts", num_lts, f"only {len(chosen)} non-overlapping cuts fit in the model")
    chosen.sort()
    return merge_consecutive_cuts(chosen) if merge_consecutive else chosen


def composed_cuts(cuts: list[Cut]) -> frozenset[Cut]:
    """The cuts that start where an earlier one ends (unmerged touching cuts). Such a cut's
    transform goes into the same down-projection as the earlier one's (block ``start - 1`` is
    gone): the official code composes them there, ``M T0 T1``, having estimated ``T1`` from the
    unpruned model as a map of the whole block output ``L_{start-1} -> L_{end-1}``."""
    ends = {end for _, end in cuts}
    return frozenset(cut for cut in cuts if cut[0] in ends)


def fusion_blocks(cuts: list[Cut]) -> dict[Cut, int]:
    """The block each cut's transform is fused into: ``start - 1``, or for a cut that touches
    an earlier one, that one's block (the last block kept before it)."""
    blocks: dict[Cut, int] = {}
    by_end: dict[int, Cut] = {}
    for cut in sorted(cuts):
        earlier = by_end.get(cut[0])
        blocks[cut] = blocks[earlier] if earlier is not None else cut[0] - 1
        by_end[cut[1]] = cut
    return blocks
