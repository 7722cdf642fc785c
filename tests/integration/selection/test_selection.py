"""Selection against a brute force over all candidate cuts, and validation of explicit cuts."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers.batches import batches_of, random_sequences
from helpers.models import tiny_model
from helpers.selection import NUM_LAYERS

from replaceme_exp.capture import CutDistances, run_capture
from replaceme_exp.models import adapter_for
from replaceme_exp.selection import candidate_cuts, merge_consecutive_cuts, select_cuts
from replaceme_exp.selection.metrics import euclidean_distance


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama", NUM_LAYERS, seed=4)
    sequences = random_sequences(6, 12, 12, seed=9)
    hidden = model(torch.tensor(sequences), output_hidden_states=True).hidden_states
    return model, sequences, hidden


def brute_force_distance(hidden, cut):
    start, end = cut
    return float((1 - F.cosine_similarity(hidden[start].double(), hidden[end].double(), dim=-1)).mean())


@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_single_cut_equals_brute_force(setup, length):
    model, sequences, hidden = setup
    cuts = candidate_cuts(NUM_LAYERS - 1, length)  # brute force via hidden_states (pre-norm blocks)
    dist = CutDistances(cuts)
    run_capture(adapter_for(model), batches_of(sequences, 4), [dist])
    best = min(cuts, key=lambda c: brute_force_distance(hidden, c))
    assert select_cuts(dist.result(), 1, True) == [best]


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


def test_l2_selection_equals_brute_force(setup):
    model, sequences, hidden = setup
    cuts = candidate_cuts(NUM_LAYERS - 1, 3)
    dist = CutDistances(cuts, euclidean_distance)
    run_capture(adapter_for(model), batches_of(sequences, 4), [dist])
    brute = {c: float((hidden[c[0]] - hidden[c[1]]).double().norm(dim=-1).mean()) for c in cuts}
    for cut in cuts:
        assert dist.result()[cut] == pytest.approx(brute[cut], rel=1e-5)
    assert select_cuts(dist.result(), 1, True) == [min(cuts, key=brute.get)]


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
