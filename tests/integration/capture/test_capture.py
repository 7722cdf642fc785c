"""Capture hooks against independent computations: index convention, padding, early stop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.batches import batches_of, random_sequences
from helpers.explicit import explicit_blocks
from helpers.models import tiny_model

from replaceme_exp.capture import CutDistances, LinearStatistics, run_capture
from replaceme_exp.capture.statistics import cosine_distance
from replaceme_exp.models import adapter_for
from replaceme_exp.selection import candidate_cuts
from replaceme_exp.selection.metrics import angular_distance


NUM_LAYERS = 6


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", NUM_LAYERS)


def explicit_reference(model, sequences, cuts):
    """Distances and LS statistics per cut from the hand-written forward pass."""
    dist = {c: [] for c in cuts}
    last = {c: [] for c in cuts}
    mtm = {c: 0 for c in cuts}
    mtr = {c: 0 for c in cuts}
    for seq in sequences:
        blocks = explicit_blocks(model, torch.tensor(seq))
        for start, end in cuts:
            a, b = blocks[start - 1]["L"], blocks[end - 1]["L"]
            cos = F.cosine_similarity(a.double(), b.double(), dim=-1)
            dist[(start, end)].append(1 - cos)
            last[(start, end)].append(torch.arccos(cos[-1].clamp(-1, 1)) / math.pi)
            m = blocks[start - 1]["M"].double()
            r = (blocks[end - 1]["L"] - blocks[start - 1]["Y"]).double()
            mtm[(start, end)] = mtm[(start, end)] + m.T @ m
            mtr[(start, end)] = mtr[(start, end)] + m.T @ r
    return (
        {c: float(torch.cat(v).mean()) for c, v in dist.items()},
        {c: float(torch.stack(v).mean()) for c, v in last.items()},
        mtm,
        mtr,
    )


def test_explicit_forward_matches_hidden_states(model):
    """The hand-written pass reproduces transformers' own hidden states (output of block k is
    hidden_states[k+1] for all but the last block, whose output precedes the final norm)."""
    ids = torch.tensor(random_sequences(1, 12, 12)[0])
    blocks = explicit_blocks(model, ids)
    hidden = model(ids[None], output_hidden_states=True).hidden_states
    for k in range(NUM_LAYERS - 1):
        torch.testing.assert_close(blocks[k]["L"], hidden[k + 1][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(blocks[k]["X"], hidden[k][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.model.norm(blocks[-1]["L"]), hidden[-1][0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("length", [1, 2, 3])
def test_hooks_follow_the_index_convention(model, length):
    adapter = adapter_for(model)
    sequences = random_sequences(5, 9, 9, seed=length)
    cuts = candidate_cuts(NUM_LAYERS, length)
    assert cuts[0] == (1, 1 + length) and cuts[-1][1] == NUM_LAYERS
    dist_all, dist_last, stats = (
        CutDistances(cuts, cosine_distance, "all"),
        CutDistances(cuts, angular_distance, "last"),
        LinearStatistics(cuts, 32, torch.device("cpu")),
    )
    run_capture(adapter, batches_of(sequences, 2), [dist_all, dist_last, stats])
    ref_all, ref_last, ref_mtm, ref_mtr = explicit_reference(model, sequences, cuts)
    result = stats.result()
    for cut in cuts:
        assert dist_all.result()[cut] == pytest.approx(ref_all[cut], rel=1e-4, abs=1e-6)
        assert dist_last.result()[cut] == pytest.approx(ref_last[cut], rel=1e-3, abs=1e-4)
        torch.testing.assert_close(result[cut].mtm, ref_mtm[cut], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(result[cut].mtr, ref_mtr[cut], rtol=1e-4, atol=1e-4)
        assert result[cut].n_tokens == sum(len(s) for s in sequences)


def test_hooks_distances_match_output_hidden_states(model):
    adapter = adapter_for(model)
    sequences = random_sequences(4, 10, 10, seed=3)
    cuts = candidate_cuts(NUM_LAYERS - 1, 2)  # ends before the last block: hidden_states apply
    dist = CutDistances(cuts)
    run_capture(adapter, batches_of(sequences, 4), [dist])
    hidden = model(torch.tensor(sequences), output_hidden_states=True).hidden_states
    for start, end in cuts:
        ref = 1 - F.cosine_similarity(hidden[start].double(), hidden[end].double(), dim=-1).mean()
        assert dist.result()[(start, end)] == pytest.approx(float(ref), rel=1e-4)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_equal_unpadded_sequences(model, side):
    adapter = adapter_for(model)
    sequences = random_sequences(7, 3, 14, seed=11)
    cuts = [(1, 3), (2, 5), (4, 6)]

    def capture(batches):
        stats, dist, last = (
            LinearStatistics(cuts, 32, torch.device("cpu")),
            CutDistances(cuts),
            CutDistances(cuts, angular_distance, "last"),
        )
        run_capture(adapter, batches, [stats, dist, last])
        return stats.result(), dist.result(), last.result()

    one_by_one = capture(batches_of(sequences, 1))
    padded = capture(batches_of(sequences, 4, side))
    assert any(len(s) < max(len(t) for t in sequences) for s in sequences)  # real padding
    for cut in cuts:
        torch.testing.assert_close(padded[0][cut].mtm, one_by_one[0][cut].mtm, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(padded[0][cut].mtr, one_by_one[0][cut].mtr, rtol=1e-4, atol=1e-5)
        assert padded[0][cut].r_sq == pytest.approx(one_by_one[0][cut].r_sq, rel=1e-5)
        assert padded[0][cut].n_tokens == sum(len(s) for s in sequences)
        assert padded[1][cut] == pytest.approx(one_by_one[1][cut], rel=1e-5)
        assert padded[2][cut] == pytest.approx(one_by_one[2][cut], rel=1e-4, abs=1e-6)


def test_capture_stops_after_the_last_needed_block(model):
    adapter = adapter_for(model)
    calls = []
    handles = [
        layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i)) for i, layer in enumerate(adapter.layers)
    ]
    try:
        blocks = run_capture(
            adapter, batches_of(random_sequences(2, 5, 5), 2), [LinearStatistics([(1, 3)], 32, torch.device("cpu"))]
        )
    finally:
        for h in handles:
            h.remove()
    assert blocks == 3
    assert sorted(set(calls)) == [0, 1, 2]


def test_layer_distance_matrix_matches_an_explicit_pass_with_padding(model):
    """Every pair (i, j): mean over all non-padding tokens of 1 - cos(L_i, L_j), from padded
    left-side batches and a chunk smaller than a batch, against the hand-written forward pass."""
    from replaceme_exp.capture import LayerDistances

    sequences = random_sequences(7, 3, 15, seed=5)
    matrix = LayerDistances(NUM_LAYERS, chunk_tokens=5)
    run_capture(adapter_for(model), batches_of(sequences, 3, side="left"), [matrix])
    result = torch.tensor(matrix.result(), dtype=torch.float64)

    outputs = [explicit_blocks(model, torch.tensor(seq)) for seq in sequences]
    expected = torch.zeros(NUM_LAYERS, NUM_LAYERS, dtype=torch.float64)
    for i in range(NUM_LAYERS):
        for j in range(NUM_LAYERS):
            cos = torch.cat([F.cosine_similarity(b[i]["L"].double(), b[j]["L"].double(), dim=-1) for b in outputs])
            expected[i, j] = 0.0 if i == j else float((1 - cos).mean())
    torch.testing.assert_close(result, expected, rtol=1e-4, atol=1e-5)
    assert torch.equal(result, result.T) and float(result[0, NUM_LAYERS - 1]) > 0.01


def test_heldout_l2_distance_without_transform_matches_an_explicit_pass(model):
    from replaceme_exp.capture import TransformDistances

    sequences = random_sequences(5, 4, 12, seed=3)
    check = TransformDistances({(2, 5): None, (1, 3): None})
    run_capture(adapter_for(model), batches_of(sequences, 2), [check])
    norms = []
    for seq in sequences:
        blocks = explicit_blocks(model, torch.tensor(seq))
        for start, end in ((2, 5), (1, 3)):
            norms.append((blocks[end - 1]["L"] - blocks[start - 1]["L"]).double().norm(dim=-1))
    assert check.l2_result() == pytest.approx(float(torch.cat(norms).mean()), rel=1e-5)
