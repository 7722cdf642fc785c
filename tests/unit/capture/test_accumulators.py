"""Statistics declared by the components that need them (:mod:`replaceme_exp.capture.accumulator`): the
worked example of docs/extending/statistic.md, a method needing a statistic the core never collected (each
sublayer's input against its output), is its page's one Python file and one YAML, and its numbers equal a
hand computation; an accumulator's state goes through the statistics cache and back."""

from __future__ import annotations

import torch
from helpers.accumulators import sublayer_cosine

from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.selection.metrics import METRICS


def test_an_accumulator_is_stored_under_its_kind_and_identity_and_read_back(tmp_path, sublayer_cosine):
    module, _ = sublayer_cosine
    cosines = module.SublayerCosines([2, 3])
    cosines.restore({"sums": torch.tensor([[1.5, 1.0], [1.8, 1.9]], dtype=torch.float64), "n_tokens": torch.tensor(2)})
    cache = StatisticsCache(tmp_path, "model", "data")
    cache.store(cosines)
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.pt")] == ["sublayer_cosines"]
    again = module.SublayerCosines([2, 3])
    assert cache.restore(again) and again.result() == {2: (0.75, 0.9), 3: (0.5, 0.95)}
    assert not cache.restore(module.SublayerCosines([2, 4]))  # another identity, another entry
    assert not StatisticsCache(tmp_path, "model", "other data").restore(module.SublayerCosines([2, 3]))


def test_a_declared_metrics_cached_distances_are_keyed_by_its_statistics_kind_and_version(sublayer_cosine):
    """Bumping an accumulator's version moves the key its metric's distances are cached under (an old
    entry is never served for the new statistic)."""
    from helpers.models import tiny_model

    from replaceme_exp.capture.token_rules import TokenRule
    from replaceme_exp.models import adapter_for
    from replaceme_exp.selection.passes import SelectionRequest, selection_distances

    module, _ = sublayer_cosine

    class Asked:
        """A cache that records the criterion it is asked for and serves distances for it."""

        criteria: list[str] = []

        def read(self, entry):
            self.criteria.append(entry.criterion)
            return {(1, 3): 0.5}

    metric = METRICS.get("sublayer_cosine")
    request = SelectionRequest(None, 2, 1, False, metric, "all", 0.0, "fused", TokenRule(), "float64")
    adapter = adapter_for(tiny_model("llama", 6, seed=1))
    cache = Asked()
    assert selection_distances(request, adapter, None, cache, [(1, 3), (2, 4)], False)[0] == {(1, 3): 0.5}
    module.SublayerCosines.version = 2
    try:
        selection_distances(request, adapter, None, cache, [(1, 3), (2, 4)], False)
    finally:
        module.SublayerCosines.version = 1
    assert cache.criteria == ["sublayer_cosine/sublayer_cosines@v1", "sublayer_cosine/sublayer_cosines@v2"]
