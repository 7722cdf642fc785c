"""Statistics declared by the components that need them (:mod:`replaceme_exp.capture.accumulator`): the
worked example of docs/extending/statistic.md, a method needing a statistic the core never collected (each
sublayer's input against its output), is its page's one Python file and one YAML, and its numbers equal a
hand computation; an accumulator's state goes through the statistics cache and back."""

from __future__ import annotations

import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from helpers.config import ROOT
from helpers.explicit import explicit_blocks
from helpers.jobs import job_config

from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.config.validate import typed_config
from replaceme_exp.data import build_calibration
from replaceme_exp.methods import METHODS
from replaceme_exp.models import load_model
from replaceme_exp.runtime import run_recorded
from replaceme_exp.selection.metrics import METRICS

PAGE = ROOT / "docs" / "extending" / "statistic.md"


@pytest.fixture
def sublayer_cosine(tmp_path):
    """The page's module, registered as a file of replaceme_exp/methods/ would be, and its YAML on Hydra's
    search path; both gone afterwards."""
    page = PAGE.read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    option = re.search(r"```yaml\n(.*?)```", page, re.S).group(1)
    module = types.ModuleType("replaceme_exp.methods.sublayer_cosine")
    sys.modules[module.__name__] = module
    exec(compile(code, "replaceme_exp/methods/sublayer_cosine.py", "exec"), module.__dict__)
    (tmp_path / "conf" / "selection").mkdir(parents=True)
    (tmp_path / "conf" / "selection" / "sublayer_cosine.yaml").write_text(option)
    yield module, f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    METRICS.remove("sublayer_cosine")
    METHODS.remove("sublayer_cosine")
    sys.modules.pop(module.__name__)


@pytest.mark.integration
@pytest.mark.slow
def test_a_method_needing_a_new_statistic_is_one_file_and_one_yaml_and_its_distances_are_the_hand_computed_ones(
    tmp_path, sublayer_cosine
):
    _, searchpath = sublayer_cosine
    cfg = job_config(tmp_path, searchpath, "selection=sublayer_cosine", "objective=identity", "save_model=false")
    row = run_recorded(cfg)
    assert row["status"] == "finished", row["error"]
    assert row["method"] == "Sublayer cosine" and row["selection_metric"] == "sublayer_cosine"

    typed = typed_config(cfg)
    loaded = load_model(typed.model, typed.cache_dir)
    cos_sums, n = None, 0
    for batch in build_calibration(typed.calibration, loaded.tokenizer):
        for ids, mask in zip(batch.input_ids, batch.attention_mask):
            blocks = explicit_blocks(loaded.model, ids[mask.bool()])
            # per block: cos(attention's input X, its output Y), cos(the MLP's input Y, its output L)
            per_token = torch.stack(
                [
                    torch.stack([F.cosine_similarity(b["X"], b["Y"], dim=-1), F.cosine_similarity(b["Y"], b["L"], dim=-1)])
                    for b in blocks
                ]
            ).double()  # (blocks, 2, seq)
            cos_sums = per_token.sum(-1) if cos_sums is None else cos_sums + per_token.sum(-1)
            n += int(mask.sum())
    block_similarity = (cos_sums / n).mean(-1)  # both sublayers, (blocks,)
    hand = {(s, e): 1.0 - float(block_similarity[s:e].mean()) for s, e, _ in row["candidate_distances"]}
    for s, e, distance in row["candidate_distances"]:
        assert distance == pytest.approx(hand[(s, e)], abs=2e-5), (s, e)
    assert row["cuts"] == [list(min(hand, key=hand.get))]
    assert len({round(d, 4) for d in hand.values()}) > 1  # the candidates differ: the choice means something


@pytest.mark.unit
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


@pytest.mark.unit
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

        def get_distances(self, length, criterion):
            self.criteria.append(criterion)
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
