"""The worked example of docs/extending/selection-metric.md: a new selection metric is one Python file
(what the test registers) and one YAML (written to a folder on Hydra's search path), and a job selects
by it the cut that a brute-force computation over the same calibration activations finds."""

from __future__ import annotations

import pytest
import torch
from helpers.config import CONF
from helpers.explicit import explicit_blocks
from helpers.jobs import SMOKE
from hydra import compose, initialize_config_dir

from replaceme_exp.config.store import register_schemas
from replaceme_exp.config.validate import typed_config
from replaceme_exp.data import build_calibration
from replaceme_exp.models import load_model
from replaceme_exp.runtime import run_recorded
from replaceme_exp.selection.metrics import METRICS, SelectionMetric, register


pytestmark = pytest.mark.slow


def manhattan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-token L1 distance; (n, d), (n, d) -> (n,)."""
    return (a.float() - b.float()).abs().sum(dim=-1)


@pytest.fixture
def manhattan_metric(tmp_path):
    """replaceme_exp/selection/manhattan.py and conf/selection/manhattan.yaml of the guide."""
    register(SelectionMetric("manhattan", "distance", token_distance=manhattan))
    register_schemas()
    options = tmp_path / "conf" / "selection"
    options.mkdir(parents=True)
    (options / "manhattan.yaml").write_text("# Mean L1 distance.\nmetric: manhattan\ntokens: all\n")
    yield f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    METRICS.remove("manhattan")


def test_a_job_selects_by_a_new_metric_the_cut_brute_force_finds(tmp_path, manhattan_metric):
    overrides = [*SMOKE, manhattan_metric, "selection=manhattan", "save_model=false"]
    overrides += [f"results_dir={tmp_path / 'results'}", f"capture.cache_dir={tmp_path / 'stats'}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    row = run_recorded(cfg)
    assert row["status"] == "finished" and row["selection_metric"] == "manhattan"

    typed = typed_config(cfg)
    loaded = load_model(typed.model, typed.cache_dir)
    sums = {(s, e): 0.0 for s, e, _ in row["candidate_distances"]}
    n = 0
    for batch in build_calibration(typed.calibration, loaded.tokenizer):
        for ids, mask in zip(batch.input_ids, batch.attention_mask):
            blocks = explicit_blocks(loaded.model, ids[mask.bool()])
            for s, e in sums:
                sums[(s, e)] += float(manhattan(blocks[s - 1]["L"], blocks[e - 1]["L"]).double().sum())
            n += int(mask.sum())
    brute = {cut: total / n for cut, total in sums.items()}
    for s, e, distance in row["candidate_distances"]:
        assert distance == pytest.approx(brute[(s, e)], rel=1e-4)
    assert row["cuts"] == [list(min(brute, key=brute.get))]
