"""Speed and memory of a pruned model against the unpruned one (replaceme_exp/evaluation/speed.py):
checked on structure, never on absolute time. A counting clock (the number of forward calls so far)
shows what each timed region contains; parameters and checkpoint bytes are checked against a count
from the config and against the files a save writes; the decode loop against greedy decoding
without a cache."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
from helpers.config import typed

from replaceme_exp.config.schema import SpeedConfig
from replaceme_exp.errors import ConfigError
from replaceme_exp.evaluation.speed import METRICS, SPEED_COLUMNS, ModelSpeed, SpeedComparison, peak_working_bytes, round_order, setting_columns


def test_rounds_alternate_and_reverse_every_other_round():
    assert [round_order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert round_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def synthetic(seconds: dict[str, list[float]], work: int | None, params: int) -> ModelSpeed:
    speed = ModelSpeed(params, 4 * params, 4 * params + 8, {"prefill": 30, "decode_b1": 5, "decode_batch": 15})
    speed.seconds = seconds
    speed.peak_work_bytes = work
    return speed


def test_a_row_holds_medians_of_the_rounds_and_the_range_of_paired_ratios():
    base = synthetic({"prefill": [2.0, 4.0, 3.0], "decode_b1": [1.0, 1.0, 1.0], "decode_batch": [6, 2, 4]}, 100, 1000)
    sub = synthetic({"prefill": [1.0, 1.0, 3.0], "decode_b1": [0.5, 2.0, 0.5], "decode_batch": [3, 1, 4]}, 60, 600)
    comparison = SpeedComparison({"speed_rounds": 3}, {"unpruned": base, "pruned": sub}, [["unpruned", "pruned"]] * 3)
    row = comparison.row()
    assert row["speed_rounds"] == 3
    assert row["speed_prefill_tok_s"] == 30 / 1.0 and row["speed_prefill_tok_s_baseline"] == 30 / 3.0
    assert row["speed_prefill_speedup"] == 3.0  # median 3 over median 1
    assert (row["speed_prefill_speedup_min"], row["speed_prefill_speedup_max"]) == (1.0, 4.0)  # 2/1, 4/1, 3/3
    assert row["speed_decode_b1_speedup"] == 2.0  # median 1 over median 0.5
    assert (row["speed_decode_b1_speedup_min"], row["speed_decode_b1_speedup_max"]) == (0.5, 2.0)
    assert row["speed_decode_batch_tok_s"] == 15 / 3 and row["speed_decode_batch_speedup"] == 4 / 3
    assert row["param_count"] == 600 and row["param_count_baseline"] == 1000 and row["param_count_ratio"] == 0.6
    assert row["checkpoint_bytes_ratio"] == 0.6
    assert row["peak_infer_mem_gb"] == (4 * 600 + 8 + 60) / 2**30
    assert row["peak_infer_mem_ratio"] == (4 * 600 + 8 + 60) / (4 * 1000 + 8 + 100)
    assert row["peak_infer_work_gb_baseline"] == 100 / 2**30
    kept = json.loads(row["speed_round_times"])
    assert kept["unpruned"]["prefill_s"] == [2.0, 4.0, 3.0] and kept["pruned"]["decode_batch_s"] == [3, 1, 4]


def column_names(pattern: str) -> set[str]:
    """``a_<b|c>`` -> {a_b, a_c}."""
    parts = [p[1:-1].split("|") if p.startswith("<") else [p] for p in re.split(r"(<[^>]+>)", pattern)]
    return {"".join(choice) for choice in itertools.product(*parts)}


def test_every_row_column_is_described():
    times = {m: [1.0, 2.0] for m in METRICS}
    settings = setting_columns(SpeedConfig(), torch.device("cpu"), torch.float32, "profiler_memory_events")
    row = SpeedComparison(settings, {"unpruned": synthetic(times, 3, 10), "pruned": synthetic(times, 2, 8)}, []).row()
    described = set().union(*(column_names(name) for name in SPEED_COLUMNS))
    assert set(row) == described


def test_unmeasured_memory_stays_missing():
    times = {m: [1.0] for m in METRICS}
    comparison = SpeedComparison({}, {"unpruned": synthetic(times, None, 10), "pruned": synthetic(times, 5, 8)}, [])
    row = comparison.row()
    assert row["peak_infer_mem_gb"] is None and row["peak_infer_mem_ratio"] is None
    assert row["param_count"] == 8  # sizes need no run


def test_the_cpu_peak_counts_the_tensors_alive_together():
    def run():
        a = torch.empty(1000)  # 4,000 bytes
        b = torch.empty(2000)  # 8,000 bytes, with a: 12,000
        del a
        c = torch.empty(500)  # 2,000 bytes, with b: 10,000
        return b, c

    before = torch.empty(10_000)
    peak, method = peak_working_bytes(run, [torch.device("cpu")])
    del before
    assert (peak, method) == (12_000, "profiler_memory_events")


def test_speed_settings_have_defaults_and_refuse_bad_values_in_one_line():
    assert typed([]).eval.speed == SpeedConfig()
    assert typed(["eval=offline", "eval.speed.enabled=false"]).eval.speed.enabled is False
    with pytest.raises(ConfigError, match=r"^eval\.speed\.batch=1: must be an integer >= 2$"):
        typed(["eval.speed.batch=1"])
    with pytest.raises(ConfigError, match=r"^eval\.speed\.rounds=0: must be a positive integer$"):
        typed(["eval.speed.rounds=0"])
