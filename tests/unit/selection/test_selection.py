"""Selection against a brute force over all candidate cuts, and validation of explicit cuts."""

from __future__ import annotations

import pytest
from helpers.selection import NUM_LAYERS

from replaceme_exp.errors import ConfigError
from replaceme_exp.selection import candidate_cuts, cut_length, merge_consecutive_cuts, select_cuts, validate_cuts


def test_consecutive_cuts_merge_or_are_kept_apart():
    distances = {cut: 0.9 for cut in candidate_cuts(10, 2)}
    distances.update({(3, 5): 0.1, (5, 7): 0.2, (6, 8): 0.3})
    assert select_cuts(distances, 2, merge_consecutive=True) == [(3, 7)]
    # Unmerged, (5, 7) would fuse its transform into block 4, which (3, 5) removes.
    assert select_cuts(distances, 2, merge_consecutive=False) == [(3, 5), (6, 8)]
    assert merge_consecutive_cuts([(6, 8), (1, 2), (2, 4)]) == [(1, 4), (6, 8)]


@pytest.mark.parametrize(
    "cuts, message",
    [
        ([[0, 3]], "outside 1 <= start < end <= num_layers=8"),
        ([[5, 9]], "outside"),
        ([[4, 4]], "outside"),
        ([[1, 4], [3, 6]], "overlap"),
        ([], "non-empty"),
        ([[1, "a"]], "not a"),
    ],
)
def test_impossible_cuts_name_the_key_and_value(cuts, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate_cuts(cuts, NUM_LAYERS)
    assert str(err.value).startswith("cuts=")


def test_n_prune_and_num_lts_are_validated():
    assert cut_length(8, 2, 32) == 4
    with pytest.raises(ConfigError, match=r"n_prune=32: the model has 32 blocks"):
        cut_length(32, 1, 32)
    with pytest.raises(ConfigError, match=r"num_lts=3: must divide n_prune=8"):
        cut_length(8, 3, 32)
    # A fraction of the depth: 25% of 32 blocks, 37.5% of 80, 12.5% of 24 (CLIP ViT-L/14) rounds to 3.
    assert cut_length(0.25, 1, 32) == 8 and cut_length(0.375, 1, 80) == 30 and cut_length(0.125, 1, 24) == 3
    assert cut_length(0.25, 2, 32) == 4
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(ConfigError, match=rf"n_prune={bad!r}: must be a positive integer"):
            cut_length(bad, 1, 32)
    with pytest.raises(ConfigError, match=r"n_prune=0.01: is less than one"):
        cut_length(0.01, 1, 32)
    assert validate_cuts([[6, 8], [1, 3]], 8) == [(1, 3), (6, 8)]
    assert validate_cuts([[3, 5], [1, 3]], 8, merge_consecutive=True) == [(1, 5)]
    with pytest.raises(ConfigError, match="touch"):
        validate_cuts([[3, 5], [1, 3]], 8, merge_consecutive=False)
