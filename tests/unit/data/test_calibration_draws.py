"""Calibration draws as a sweep axis (calibration.draw): another sample with every other seed kept, the
draw-th slice of records read in order, rows that say which draw, and identities (draw 0 keeps every
hash; draws share the setting hash, as seeds do)."""

from __future__ import annotations

import json

import pytest
from helpers.config import config_hash, setting_hash, typed

from replaceme_exp.config.validate import build_option
from replaceme_exp.data.calibration import (
    CALIBRATION_SOURCES,
    as_read_by,
    build_calibration,
    drawn,
    mix_parts,
    sample_seed,
)


def calib_cfg(**kw):
    base = dict(name="t", source="pydoc", n_samples=8, seq_len=64, batch_size=3, padding_side="right", seed=0)
    base.update(kw)
    return as_read_by(build_option("calibration", base, "calibration"), "paper")


def read(cfg, tokenizer=None):
    cfg = drawn(cfg)
    return CALIBRATION_SOURCES.get(cfg.source).read(cfg, tokenizer, cfg.n_samples, int(cfg.seed), None)


def test_draw_zero_is_the_seeds_sample_and_other_draws_are_other_samples():
    assert sample_seed(calib_cfg(seed=42)) == 42 and drawn(calib_cfg(seed=42)) == calib_cfg(seed=42)
    seeds = {sample_seed(calib_cfg(seed=s, draw=d)) for s in range(20) for d in range(1, 6)}
    assert len(seeds) == 100 and not seeds & set(range(20))  # no (seed, draw) draws another's sample
    samples = [read(calib_cfg(draw=d, n_samples=16)) for d in range(3)]
    assert all(len(s) == 16 for s in samples)
    assert len({tuple(sorted(s)) for s in samples}) == 3  # three subsets of the pydoc documents
    assert read(calib_cfg(draw=2, n_samples=16)) == samples[2]  # reproducible


def test_records_read_in_order_take_the_draws_slice(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"text": f"record number {i}"}) + "\n" for i in range(30)))
    base = dict(source="hf_dataset", dataset="json", path=str(path), text_field="text", n_samples=5, order="first")
    for draw in range(3):
        found = read(calib_cfg(**base, draw=draw))
        assert found == [f"record number {i}" for i in range(5 * draw, 5 * draw + 5)]


def test_a_mix_hands_its_draw_to_its_parts(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"text": f"record number {i}"}) + "\n" for i in range(30)))
    part = {"source": "hf_dataset", "dataset": "json", "path": str(path), "text_field": "text", "order": "first"}
    cfg = calib_cfg(
        source="mix", n_samples=4, draw=2, parts={"a": {**part, "fraction": 0.5}, "b": {**part, "fraction": 0.5}}
    )
    assert all(p.draw == 2 for _, p, _ in mix_parts(cfg, 4))
    found = read(cfg)
    assert sorted(found) == sorted(f"record number {i}" for i in (4, 5, 4, 5))


def test_draws_move_the_config_hash_not_the_setting_hash_and_draw_zero_moves_nothing():
    plain, zero, one, two = (
        typed(o) for o in ([], ["calibration.draw=0"], ["calibration.draw=1"], ["calibration.draw=2"])
    )
    assert config_hash(plain) == config_hash(zero)
    assert len({config_hash(plain), config_hash(one), config_hash(two)}) == 3
    assert setting_hash(plain) == setting_hash(one) == setting_hash(two)
    from replaceme_exp.pipeline.spec import JobSpec

    columns = JobSpec.from_config(one).setting_columns()
    assert columns["calibration_draw"] == 1 and columns["calibration_sample_seed"] == sample_seed(one.calibration)
    assert JobSpec.from_config(plain).setting_columns()["calibration_sample_seed"] == 42


def test_a_negative_draw_is_refused_in_one_line():
    from replaceme_exp.errors import ConfigError

    with pytest.raises(ConfigError, match="calibration.draw"):
        typed(["calibration.draw=-1"])


def test_another_draw_tokenises_other_calibration_batches(smollm2_tokenizer):
    first = build_calibration(calib_cfg(n_samples=12), smollm2_tokenizer)
    again = build_calibration(calib_cfg(n_samples=12), smollm2_tokenizer)
    other = build_calibration(calib_cfg(n_samples=12, draw=1), smollm2_tokenizer)
    assert first.content_hash() == again.content_hash() != other.content_hash()
