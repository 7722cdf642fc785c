"""Selection against a brute force over all candidate cuts, and validation of explicit cuts."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers.batches import batches_of, random_sequences
from helpers.models import tiny_model

from replaceme_exp.capture import CutDistances, run_capture
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.selection import candidate_cuts, cut_length, merge_consecutive_cuts, select_cuts, validate_cuts
from replaceme_exp.selection.metrics import euclidean_distance

NUM_LAYERS = 8


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama", NUM_LAYERS, seed=4)
    sequences = random_sequences(6, 12, 12, seed=9)
    hidden = model(torch.tensor(sequences), output_hidden_states=True).hidden_states
    return model, sequences, hidden


def brute_force_distance(hidden, cut):
    start, end = cut
    return float((1 - F.cosine_similarity(hidden[start].double(), hidden[end].double(), dim=-1)).mean())


@pytest.mark.integration
@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_single_cut_equals_brute_force(setup, length):
    model, sequences, hidden = setup
    cuts = candidate_cuts(NUM_LAYERS - 1, length)  # brute force via hidden_states (pre-norm blocks)
    dist = CutDistances(cuts)
    run_capture(adapter_for(model), batches_of(sequences, 4), [dist])
    best = min(cuts, key=lambda c: brute_force_distance(hidden, c))
    assert select_cuts(dist.result(), 1, True) == [best]


@pytest.mark.integration
def test_multi_cut_selection_is_greedy_by_distance_and_never_overlaps(setup):
    model, sequences, hidden = setup
    cuts = candidate_cuts(NUM_LAYERS - 1, 2)
    dist = CutDistances(cuts)
    run_capture(adapter_for(model), batches_of(sequences, 3), [dist])
    brute = {c: brute_force_distance(hidden, c) for c in cuts}
    chosen = select_cuts(dist.result(), 2, merge_consecutive=False)
    first = min(cuts, key=brute.get)
    # Unmerged cuts keep a surviving block between them (the second one's fusion target).
    second = min((c for c in cuts if c[1] < first[0] or first[1] < c[0]), key=brute.get)
    assert chosen == sorted([first, second])
    for a, b in itertools.combinations(chosen, 2):
        assert a[1] < b[0] or b[1] < a[0]
    merged = select_cuts(dist.result(), 2, merge_consecutive=True)
    second = min((c for c in cuts if c[1] <= first[0] or first[1] <= c[0]), key=brute.get)
    assert merged == merge_consecutive_cuts([first, second])


@pytest.mark.unit
def test_consecutive_cuts_merge_or_are_kept_apart():
    distances = {cut: 0.9 for cut in candidate_cuts(10, 2)}
    distances.update({(3, 5): 0.1, (5, 7): 0.2, (6, 8): 0.3})
    assert select_cuts(distances, 2, merge_consecutive=True) == [(3, 7)]
    # Unmerged, (5, 7) would fuse its transform into block 4, which (3, 5) removes.
    assert select_cuts(distances, 2, merge_consecutive=False) == [(3, 5), (6, 8)]
    assert merge_consecutive_cuts([(6, 8), (1, 2), (2, 4)]) == [(1, 4), (6, 8)]


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.integration
def test_l2_selection_equals_brute_force(setup):
    model, sequences, hidden = setup
    cuts = candidate_cuts(NUM_LAYERS - 1, 3)
    dist = CutDistances(cuts, euclidean_distance)
    run_capture(adapter_for(model), batches_of(sequences, 4), [dist])
    brute = {c: float((hidden[c[0]] - hidden[c[1]]).double().norm(dim=-1).mean()) for c in cuts}
    for cut in cuts:
        assert dist.result()[cut] == pytest.approx(brute[cut], rel=1e-5)
    assert select_cuts(dist.result(), 1, True) == [min(cuts, key=brute.get)]


@pytest.mark.integration
@pytest.mark.parametrize("alpha", [0.0, 5.0])
def test_ls_residual_selection_equals_brute_force_over_estimated_transforms(alpha):
    from helpers.explicit import explicit_blocks

    from replaceme_exp.capture import LinearStatistics
    from replaceme_exp.estimation.least_squares import ls_residuals

    model = tiny_model("llama", 6, seed=6)
    sequences = random_sequences(10, 8, 14, seed=2)
    cuts = candidate_cuts(6, 2)
    stats = LinearStatistics(cuts, 32, torch.device("cpu"))
    run_capture(adapter_for(model), batches_of(sequences, 4, "left"), [stats])
    residuals = ls_residuals(stats.result(), alpha)
    blocks = [explicit_blocks(model, torch.tensor(s)) for s in sequences]
    brute = {}
    for start, end in cuts:
        m = torch.cat([b[start - 1]["M"] for b in blocks]).double()
        r = torch.cat([b[end - 1]["L"] - b[start - 1]["Y"] for b in blocks]).double()
        a = torch.cat([m, alpha**0.5 * torch.eye(32, dtype=torch.float64)])
        t = torch.linalg.lstsq(a, torch.cat([r, torch.zeros(32, 32, dtype=torch.float64)])).solution
        brute[(start, end)] = float((m @ t - r).pow(2).sum()) / m.shape[0]
    for cut in cuts:
        assert residuals[cut] == pytest.approx(brute[cut], rel=1e-4)
    assert select_cuts(residuals, 1, True) == [min(cuts, key=brute.get)]
