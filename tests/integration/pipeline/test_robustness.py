"""Nothing wrong, nothing lost: bad input refused before any model loads, rows and models that
survive kills, full disks, concurrent identical jobs and broken row files."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from helpers.jobs import job_config

from replaceme_exp.config.validate import typed_config
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded


@pytest.mark.slow
def test_identical_jobs_at_once_run_once_and_models_are_readable_by_others(tmp_path):
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=full")
    rows = []
    threads = [threading.Thread(target=lambda: rows.append(run_recorded(cfg))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["status"] for r in rows) == ["finished", "skipped"]
    assert len(ResultsStore(tmp_path).load()) == 1
    model_dir = next(r["pruned_model_path"] for r in rows if r["status"] == "finished")
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(model_dir).st_mode & 0o777 == 0o777 & ~umask
    weights = next(Path(model_dir).glob("*.safetensors"))  # safetensors writes 0600 files
    assert os.stat(weights).st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.slow
def test_a_model_moved_aside_by_a_killed_rerun_is_restored_not_skipped_away(tmp_path):
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=full")
    first = run_recorded(cfg)
    model_dir = first["pruned_model_path"]
    aside = tmp_path / "models" / f".old-{first['config_hash']}-killed"
    aside.mkdir()
    os.rename(model_dir, aside / "model")  # what a forced rerun killed between its renames leaves
    again = run_recorded(cfg)
    assert again["status"] == "skipped" and os.path.isfile(os.path.join(model_dir, "config.json"))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_cache_entry_is_reported_removed_and_recomputed(tmp_path, caplog, damage):
    run_recorded(job_config(tmp_path, "cuts=[[2,4]]", "save_model=false"))
    (entry,) = (tmp_path / "stats").glob("linear-*.pt")
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x10  # one bit, inside M^T M / M^T (L - Y)
    else:
        data = data[: len(data) // 3]
    entry.write_bytes(bytes(data))
    (baseline,) = [p for p in (tmp_path / "baselines").glob("*.json") if '"ppl_heldout"' in p.read_text()]
    tampered = json.loads(baseline.read_text())
    tampered["value"]["nll"][0] *= 2  # a changed value (a window's NLL) under the old checksum
    baseline.write_text(json.dumps(tampered))
    with caplog.at_level("WARNING"):
        row = run_recorded(job_config(tmp_path, "cuts=[[2,4]]", "save_model=false", "alpha=1"))
    assert row["status"] == "finished" and "statistics" not in row["cached_stages"]
    assert str(entry) in caplog.text and str(baseline) in caplog.text
    fresh = tmp_path / "fresh"
    reference = run_recorded(
        job_config(fresh, "cuts=[[2,4]]", "save_model=false", "alpha=1", f"capture.cache_dir={fresh}/stats")
    )
    assert row["ppl_heldout"] == pytest.approx(reference["ppl_heldout"], rel=1e-6)
    assert row["ppl_heldout_baseline"] == pytest.approx(reference["ppl_heldout_baseline"], rel=1e-9)


@pytest.mark.parametrize("objective", ["identity", "ls"])
def test_a_nan_weight_fails_the_job_naming_the_stage_and_the_weight(tmp_path, smollm2_tokenizer, objective):
    import torch
    from helpers.models import tiny_model

    model = tiny_model("llama", num_layers=6, vocab=len(smollm2_tokenizer))
    with torch.no_grad():
        model.model.layers[3].mlp.down_proj.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "ckpt")
    smollm2_tokenizer.save_pretrained(tmp_path / "ckpt")
    local = ["model=smollm2_135m", "model.source=local", f"model.pretrained={tmp_path / 'ckpt'}", "model.dtype=float32"]
    row = run_recorded(job_config(tmp_path, *local, f"objective={objective}"), raise_on_failure=False)
    assert row["status"] == "failed"
    assert row["failed_stage"] == "load"
    assert row["error"] == (
        "ConfigError: model='smollm2_135m': the weight model.layers.3.mlp.down_proj.weight is not finite "
        "(NaN or inf): the checkpoint is broken"
    )


@pytest.mark.slow
def test_the_next_run_of_a_configuration_removes_its_leftover_token_stores(tmp_path):
    from helpers.config import config_hash

    from replaceme_exp.models.fingerprint import weights_fingerprint

    stores = tmp_path / "stores"
    overrides = ["cuts=[[2,4]]", "save_model=false", "objective=cosine", "objective.epochs=1"]
    overrides += ["store.location=disk", f"store.directory={stores}"]
    cfg = job_config(tmp_path, *overrides)
    chash = config_hash(cfg, weights_fingerprint(typed_config(cfg).model, cfg.cache_dir))
    (stores / f"token-store-{chash}-999999999-abc").mkdir(parents=True)  # a killed run's (no such pid)
    (stores / f"token-store-{chash}-{os.getpid()}-live").mkdir()  # a running job's store stays
    (stores / "token-store-otherconfig-1-x").mkdir()
    row = run_recorded(cfg)
    assert row["status"] == "finished" and row["store_location"] == "disk"
    left = sorted(p.name for p in stores.iterdir())
    assert left == sorted([f"token-store-{chash}-{os.getpid()}-live", "token-store-otherconfig-1-x"])
