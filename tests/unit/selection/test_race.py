"""The candidate race of the one-pass capture (replaceme_exp/selection/race.py): which candidates drop
out (against a t statistic computed here from the per-sequence distances), that the accumulators
keep no partial statistics, and that a job's selection and statistics are bit for bit those of a
capture gathering every candidate to the end, also when the selected cut had dropped out."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.models import tiny_model
from helpers.race import selected

import replaceme_exp.estimation  # noqa: F401 - registers the ls_residual selection
from replaceme_exp.capture import CutDistances, LinearStatistics, run_capture
from replaceme_exp.models import adapter_for
from replaceme_exp.selection.race import CandidateRace


CUTS = [(1, 3), (2, 4), (3, 5), (4, 6)]


def fed(values: dict, batch: int) -> CutDistances:
    """A CutDistances kept per sequence, fed ``values[cut]`` (sequences,) in batches of ``batch``."""
    distances = CutDistances(list(values), per_sequence=True)
    for cut, row in values.items():
        distances.sequence_values[cut] = list(torch.as_tensor(row, dtype=torch.float64).split(batch))
    return distances


def test_a_candidate_drops_out_when_its_paired_gap_passes_z_standard_errors_and_not_before_min_sequences():
    generator = torch.Generator().manual_seed(0)
    base = torch.rand(32, generator=generator, dtype=torch.float64)

    def noise():
        return torch.randn(32, generator=generator, dtype=torch.float64) * 0.1

    values = {
        (1, 3): base + noise(),
        (2, 4): base + 0.5 + noise(),  # far above the others
        (3, 5): base + 0.02 + noise(),  # within noise
        (4, 6): base + noise(),
    }
    # independently: the leader of lowest sum, each other's t statistic of the paired gaps
    leader = min(values, key=lambda cut: float(values[cut].sum()))
    expected = set()
    for cut, row in values.items():
        gap = (row - values[leader]).numpy()
        if cut != leader and gap.mean() / (gap.std(ddof=1) / math.sqrt(len(gap))) > 5:
            expected.add(cut)
    assert expected == {(2, 4)}  # the data do what the test means
    early = CandidateRace(fed({cut: row[:8] for cut, row in values.items()}, 8))
    assert all(early.still_in(cut) for cut in values) and not early.dropped  # 8 < 16 sequences
    race = CandidateRace(fed(values, 8))
    assert {cut for cut in values if not race.still_in(cut)} == expected
    assert race.dropped == {(2, 4): 32}


def test_only_batches_that_every_running_candidate_completed_count():
    """Mid-batch, a later cut has not yet seen the batch: the race decides on the batches all have."""
    values = {(1, 3): torch.zeros(24, dtype=torch.float64), (2, 4): torch.ones(24, dtype=torch.float64)}
    distances = fed(values, 8)
    distances.sequence_values[(2, 4)] = distances.sequence_values[(2, 4)][:1]  # 8 sequences seen by it
    race = CandidateRace(distances)
    assert race.still_in((2, 4))  # only 8 sequences in common: too few
    distances.sequence_values[(2, 4)].append(torch.ones(8, dtype=torch.float64))
    assert not race.still_in((2, 4)) and race.dropped == {(2, 4): 16}


def test_per_sequence_values_add_up_to_the_distance_sums():
    model = tiny_model(num_layers=6, seed=1)
    batches = batches_of(random_sequences(6, 5, 14, seed=2), 3)
    for tokens in ("all", "last"):
        kept = CutDistances(CUTS, tokens=tokens, per_sequence=True)
        plain = CutDistances(CUTS, tokens=tokens)
        run_capture(adapter_for(model), batches, [kept, plain])
        assert kept.sums == plain.sums and kept.counts == plain.counts
        for cut in CUTS:
            per_sequence = torch.cat(kept.sequence_values[cut])
            assert per_sequence.shape == (6,)
            assert float(per_sequence.sum()) == pytest.approx(kept.sums[cut], rel=1e-12)


def test_a_dropped_cut_leaves_no_statistics_and_the_others_are_bit_for_bit_unchanged():
    model = tiny_model(num_layers=6, seed=1)
    adapter = adapter_for(model)
    batches = batches_of(random_sequences(6, 5, 14, seed=2), 2)
    asked = []

    def keeps(cut):
        asked.append(cut)
        return cut != (2, 4) or len(asked) < 3  # (2, 4) drops out in the second batch

    racing = LinearStatistics(CUTS, adapter.hidden_size, torch.device("cpu"), keeps=keeps)
    full = LinearStatistics(CUTS, adapter.hidden_size, torch.device("cpu"))
    run_capture(adapter, batches, [racing, full])
    assert racing.dropped == {(2, 4)}
    kept, reference = racing.result(), full.result()
    assert sorted(kept) == [(1, 3), (3, 5), (4, 6)]
    for cut, stats in kept.items():
        assert torch.equal(stats.mtm, reference[cut].mtm) and torch.equal(stats.mtr, reference[cut].mtr)
        assert stats.r_sq == reference[cut].r_sq and stats.n_tokens == reference[cut].n_tokens


@pytest.mark.parametrize(
    ("changes", "races"),
    [
        ({}, True),
        ({"drop_candidates": False}, False),
        ({"num_lts": 2, "n_prune": 4}, False),  # several cuts: the race picks one
        ({"metric": "ls_residual"}, False),  # distances from the statistics themselves
        ({"passes": "two"}, False),  # the selection pass gathers no statistics
    ],
)
def test_the_race_runs_only_where_one_pass_gathers_every_candidate_for_one_cut(changes, races):
    from replaceme_exp.selection import passes

    seen = []
    original = passes.selection_passes

    def spy(request, adapter, calibration, groups, riders, race=None):
        seen.append(race is not None)
        return original(request, adapter, calibration, groups, riders, race)

    model = tiny_model(num_layers=8, seed=5)
    batches = batches_of(random_sequences(24, 10, 20, seed=6), 8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(passes, "selection_passes", spy)
        selected(model, batches, **changes)
    assert seen == [races]
