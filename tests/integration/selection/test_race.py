"""The candidate race of the one-pass capture (replaceme_exp/selection/race.py): which candidates drop
out (against a t statistic computed here from the per-sequence distances), that the accumulators
keep no partial statistics, and that a job's selection and statistics are bit for bit those of a
capture gathering every candidate to the end, also when the selected cut had dropped out."""

from __future__ import annotations

import logging

import torch
from helpers.batches import batches_of, random_sequences
from helpers.models import tiny_model
from helpers.race import selected

import replaceme_exp.estimation  # noqa: F401 - registers the ls_residual selection
from replaceme_exp.selection.race import CandidateRace


def assert_same_selection(found, reference):
    assert found.cuts == reference.cuts and found.distances == reference.distances
    assert sorted(found.stats) == sorted(reference.stats)
    for cut, stats in found.stats.items():
        assert torch.equal(stats.mtm, reference.stats[cut].mtm) and torch.equal(stats.mtr, reference.stats[cut].mtr)
        assert stats.r_sq == reference.stats[cut].r_sq and stats.n_tokens == reference.stats[cut].n_tokens


def test_the_race_drops_candidates_and_the_selection_and_its_statistics_are_those_of_the_full_capture(caplog):
    model = tiny_model(num_layers=8, seed=5)
    batches = batches_of(random_sequences(48, 10, 20, seed=6), 8)
    reference = selected(model, batches, drop_candidates=False)
    with caplog.at_level(logging.INFO, logger="replaceme_exp"):
        racing = selected(model, batches)
    assert_same_selection(racing, reference)
    dropped = [r.getMessage() for r in caplog.records if "out of the running" in r.getMessage()]
    assert dropped and not any("capture (statistics)" in r.getMessage() for r in caplog.records), dropped


def test_a_selected_cut_that_had_dropped_out_is_captured_in_a_second_pass(monkeypatch, caplog):
    """A race that drops every candidate at once: the selected cut's statistics come from a second
    pass, the same numbers."""
    model = tiny_model(num_layers=8, seed=5)
    batches = batches_of(random_sequences(48, 10, 20, seed=6), 8)
    reference = selected(model, batches, drop_candidates=False)

    def drop_all(self):
        self.dropped.update({cut: 0 for cut in self.distances.cuts})

    monkeypatch.setattr(CandidateRace, "_decide", drop_all)
    with caplog.at_level(logging.INFO, logger="replaceme_exp"):
        racing = selected(model, batches)
    assert_same_selection(racing, reference)
    assert any("capture (statistics)" in r.getMessage() for r in caplog.records)
