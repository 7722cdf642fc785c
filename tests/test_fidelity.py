"""Numbers a researcher can trust: equivalent spellings hash equal, caches keyed by weights
content and code semantics, cached stages recorded, the official pipeline's preset and loader,
masking as augmentation, the 4-bit option's refusal, CodeCarbon on the job's own GPUs."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config, config_hash, setting_hash, typed
from helpers.jobs import SMOKE, job_config
from helpers.models import tiny_model

from replaceme_exp.capture import LinearStatistics, run_capture
from replaceme_exp.data.augmentation import with_masked_copies
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.data.sources import first_pair
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.models.fingerprint import directory_digest, file_digest
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.tracking.emissions import job_gpu_ids


@pytest.mark.unit
@pytest.mark.parametrize(
    "spellings",
    [
        (["alpha=0"], ["alpha=0.0"], []),
        (["experiment=uidl_baseline"], ["objective=identity", "selection=uidl"]),
        (["regularizer=none"], ["regularizer=l2", "alpha=0"]),
        (["objective=identity", "alpha=5"], ["objective=identity", "structure=diagonal"]),
        (["cuts=[[2,4]]", "selection=l2"], ["cuts=[[2,4]]", "n_prune=4"]),
        (["mask_ratio=0", "mask_passes=3"], []),
    ],
)
def test_equivalent_spellings_hash_equal(spellings):
    hashes = {config_hash(compose_config(SMOKE + list(s))) for s in spellings}
    assert len(hashes) == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    "one, other",
    [
        ([], ["alpha=1"]),
        ([], ["seed=1"]),
        ([], ["objective=identity"]),
        ([], ["mask_ratio=0.25"]),
        # identity fuses nothing, but ls_residual selection solves ridge in the given placement
        (["objective=identity", "selection=ls_residual"], ["objective=identity", "selection=ls_residual", "alpha=10"]),
        (
            ["objective=identity", "selection=ls_residual"],
            ["objective=identity", "selection=ls_residual", "lt_placement=separate"],
        ),
    ],
)
def test_different_settings_hash_apart(one, other):
    assert config_hash(compose_config(SMOKE + one)) != config_hash(compose_config(SMOKE + other))


@pytest.mark.unit
def test_a_local_data_file_enters_the_hash_by_content(tmp_path):
    data = tmp_path / "calib.txt"
    data.write_text("first version\n\nof the text")
    overrides = ["calibration=text_file", f"calibration.path={data}", f"cache_dir={tmp_path}/c"]
    cfg = lambda: compose_config(SMOKE + overrides)  # noqa: E731
    before = config_hash(cfg())
    data.write_text("second version\n\nof the text")
    assert config_hash(cfg()) != before


@pytest.mark.unit
def test_setting_hash_ignores_only_the_seed():
    base = compose_config(SMOKE)
    assert setting_hash(base) == setting_hash(compose_config(SMOKE + ["seed=7"]))
    assert setting_hash(base) != setting_hash(compose_config(SMOKE + ["alpha=1"]))
    assert setting_hash(base) != setting_hash(compose_config(SMOKE + ["model.dtype=bfloat16"]))


@pytest.mark.unit
def test_file_digest_follows_content_not_path(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"a" * 100)
    memo = tmp_path / "memo"
    first = file_digest(f, memo)
    assert file_digest(f, memo) == first and len(list(memo.iterdir())) == 1
    f.write_bytes(b"b" * 100)  # replaced in place: same path, same size
    assert file_digest(f, memo) != first
    assert directory_digest(tmp_path, memo) != directory_digest(tmp_path / "memo", memo)


def save_local_checkpoint(path, init_seed: int, tokenizer) -> None:
    model = tiny_model("llama", num_layers=6, seed=init_seed, vocab=len(tokenizer))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.mark.integration
@pytest.mark.slow
def test_a_replaced_local_checkpoint_does_not_reuse_statistics(tmp_path, smollm2_tokenizer):
    checkpoint = tmp_path / "ckpt"
    save_local_checkpoint(checkpoint, 0, smollm2_tokenizer)
    local = [  # a local checkpoint (model and tokenizer from its folder), in float32 as tiny_llama
        "model=smollm2_135m",
        "model.source=local",
        f"model.pretrained={checkpoint}",
        "model.dtype=float32",
        "cuts=[[2,4]]",
        "save_model=false",
    ]
    first = run_recorded(job_config(tmp_path, *local))
    assert first["status"] == "finished", first["error"]
    again = run_recorded(job_config(tmp_path, *local, "alpha=1"))  # same weights: statistics reused
    assert "statistics" in again["cached_stages"] and "baseline_ppl" in again["cached_stages"]

    save_local_checkpoint(checkpoint, 1, smollm2_tokenizer)  # new weights, same path
    replaced = run_recorded(job_config(tmp_path, *local))
    assert replaced["status"] == "finished", replaced["error"]  # not skipped as the old config
    assert replaced["config_hash"] != first["config_hash"]
    assert replaced["cached_stages"] == []
    assert replaced["ppl_heldout_baseline"] != first["ppl_heldout_baseline"]


@pytest.mark.integration
@pytest.mark.slow
def test_force_recomputes_caches_and_rows_say_what_was_cached(tmp_path):
    first = run_recorded(job_config(tmp_path, "save_model=false"))
    assert first["status"] == "finished" and first["cached_stages"] == []
    second = run_recorded(job_config(tmp_path, "save_model=false", "alpha=2"))
    assert {"selection", "statistics", "baseline_ppl"} <= set(second["cached_stages"])
    forced = run_recorded(job_config(tmp_path, "save_model=false", "alpha=2", "force=true"))
    assert forced["status"] == "finished" and forced["cached_stages"] == []
    assert forced["time_capture_s"] > 0


@pytest.mark.unit
def test_masked_copies_are_seeded_keep_positions_and_never_hide_the_first_token():
    batches = batches_of(random_sequences(6, 10, 30, seed=3), 3)
    a = with_masked_copies(batches, 0.3, 2, seed=5)
    b = with_masked_copies(batches, 0.3, 2, seed=5)
    c = with_masked_copies(batches, 0.3, 2, seed=6)
    assert len(a) == 3 * len(batches) and a.content_hash() == b.content_hash() != c.content_hash()
    assert a.content_hash() != batches.content_hash()
    for plain, masked in zip(batches, list(a)[len(batches) :]):
        mask, hidden = plain.attention_mask.bool(), masked.attention_mask.bool()
        assert not (hidden & ~mask).any()  # padding stays padding
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        assert masked.position_ids.equal(positions)
        assert hidden[mask & (positions == 0)].all()  # the first token of each sequence is kept
        dropped = (mask & ~hidden).sum().item() / mask.sum().item()
        assert 0.1 < dropped < 0.5
    with pytest.raises(ConfigError, match="mask_ratio"):
        with_masked_copies(batches, 1.0, 1, 0)
    with pytest.raises(ConfigError, match="mask_passes"):
        with_masked_copies(batches, 0.5, 0, 0)


@pytest.mark.integration
def test_masking_changes_the_captured_statistics_reproducibly():
    adapter = adapter_for(tiny_model("llama", num_layers=4))
    batches = batches_of(random_sequences(8, 12, 24, seed=1), 4)

    def stats(data):
        acc = LinearStatistics([(2, 3)], adapter.hidden_size, torch.device("cpu"))
        run_capture(adapter, data, [acc])
        return acc.result()[(2, 3)]

    plain = stats(batches)
    first, again = stats(with_masked_copies(batches, 0.25, 1, 9)), stats(with_masked_copies(batches, 0.25, 1, 9))
    other = stats(with_masked_copies(batches, 0.25, 1, 10))
    assert torch.equal(first.mtm, again.mtm) and torch.equal(first.mtr, again.mtr)
    assert not torch.allclose(first.mtm, other.mtm)
    assert first.n_tokens > plain.n_tokens
    # The augmented statistics are the plain ones plus those of the masked copies.
    augmented = with_masked_copies(batches, 0.25, 1, 9)
    copies = stats(TokenBatches(list(augmented)[len(batches) :], augmented.seq_len))
    assert torch.allclose(first.mtm, plain.mtm + copies.mtm)


@pytest.mark.integration
@pytest.mark.slow
def test_masking_runs_for_closed_form_and_numerical_objectives(tmp_path):
    for objective in (["objective=ls"], ["objective=cosine", "objective.epochs=1"]):
        plain = run_recorded(job_config(tmp_path, "cuts=[[2,4]]", "save_model=false", *objective))
        masked = run_recorded(
            job_config(tmp_path, "cuts=[[2,4]]", "save_model=false", "mask_ratio=0.3", "mask_passes=2", *objective)
        )
        assert masked["status"] == "finished", masked["error"]
        assert masked["n_estimation_tokens"] > 2 * plain["n_calib_tokens"]
        assert masked["mask_ratio"] == 0.3 and masked["mask_passes"] == 2
        assert masked["cos_dist_after"] != plain["cos_dist_after"]


@pytest.mark.unit
def test_official_slimorca_loader_takes_the_first_records_and_their_first_pair(tmp_path, smollm2_tokenizer):
    from replaceme_exp.data import build_calibration

    path = tmp_path / "orca.jsonl"
    records = [
        {
            "conversations": [
                {"from": "system", "value": "You are an AI assistant."},
                {"from": "human", "value": f"Question {i}?"},
                {"from": "gpt", "value": f"Answer {i}."},
                {"from": "human", "value": "A follow-up."},
                {"from": "gpt", "value": "A second answer."},
            ]
        }
        for i in range(10)
    ]
    path.write_text("\n".join(json.dumps(r) for r in records))
    cfg = typed(
        ["calibration=jsonl", f"calibration.path={path}", "calibration.chat_field=conversations"]
        + ["calibration.order=first", "calibration.chat_turns=first_pair", "calibration.n_samples=4"]
    ).calibration
    decoded = [
        smollm2_tokenizer.decode(ids[m.bool()])
        for b in build_calibration(cfg, smollm2_tokenizer)
        for ids, m in zip(b.input_ids, b.attention_mask)
    ]
    assert sorted(d.split("Question ")[1][0] for d in decoded) == ["0", "1", "2", "3"]  # the first four, in order
    assert all("follow-up" not in d and "You are an AI assistant" not in d for d in decoded)
    assert first_pair([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])[1]["content"] == "b"
    shuffled = typed(["calibration=jsonl", f"calibration.path={path}", "calibration.chat_field=conversations"])
    assert shuffled.calibration.order == "shuffled" and shuffled.calibration.chat_turns == "all"
    official = compose_config(["calibration=slimorca_official"]).calibration
    settings = (official.order, official.chat_turns, official.n_samples, official.seq_len)
    assert settings == ("first", "first_pair", 8000, 1024)


@pytest.mark.integration
@pytest.mark.slow
def test_replaceme_official_runs_with_last_token_angular_selection_and_minibatch_solver_steps(tmp_path):
    cfg = job_config(
        tmp_path,
        "experiment=replaceme_official",
        "calibration=pydoc",
        "calibration.n_samples=24",
        "calibration.seq_len=64",
        "objective=cosine",
        "objective.solver=lbfgs",
        "objective.epochs=2",
        "objective.batch_tokens=256",
        "save_model=false",
    )
    runs = JobSpec.from_config(cfg).config  # protocol=official, applied
    assert runs.selection.metric == "angular" and runs.selection.tokens == "last" and runs.merge_consecutive
    row = run_recorded(cfg)
    assert row["status"] == "finished", row["error"]
    assert row["selection_metric"] == "angular_last" and row["solver"] == "lbfgs"
    assert row["solver_schedule"] == "minibatch" and row["protocol"] == "official"
    assert len(next(iter(row["loss_curves"].values()))) == 3  # start + one mean per epoch
    ls = JobSpec.from_config(compose_config(["experiment=replaceme_official"])).config
    assert ls.objective.name == "ls" and ls.alpha == 0
    assert (ls.calibration.name, ls.calibration.order, ls.calibration.chat_turns) == ("slimorca", "first", "first_pair")
    cosine = JobSpec.from_config(compose_config(["experiment=replaceme_official_cosine"])).config
    assert cosine.multi_lt == "sequential" and not cosine.merge_consecutive and cosine.objective.name == "cosine"
    assert compose_config(["experiment=uidl_official"]).objective.name == "identity"
    # the official reproduce configs prune 8 blocks (layers_to_skip) and run the lm-eval suite
    for preset in ("replaceme_official", "replaceme_official_cosine", "uidl_official"):
        official = compose_config([f"experiment={preset}"])
        assert (official.n_prune, official.eval.name) == (8, "paper"), preset


@pytest.mark.unit
def test_nf4_capture_is_refused_clearly_without_bitsandbytes_or_a_gpu(tmp_path):
    row = run_recorded(job_config(tmp_path, "model.capture_4bit=true"), raise_on_failure=False)
    assert row["status"] == "failed" and row["error"].startswith("ConfigError: model.capture_4bit=True")
    if not torch.cuda.is_available():
        cfg = typed(["model=llama3_8b_instruct", "model.capture_4bit=true"])
        from replaceme_exp.models.loading import check_nf4_capture

        with pytest.raises(ConfigError, match="model.capture_4bit"):
            check_nf4_capture(cfg.model)


@pytest.mark.unit
def test_codecarbon_measures_the_jobs_own_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert job_gpu_ids("auto", None, False, 0) is None
    assert job_gpu_ids("cuda:2", None, True, 4) == [2]
    assert job_gpu_ids("auto", "auto", True, 3) == [0, 1, 2]
    assert job_gpu_ids("cpu", None, True, 2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert job_gpu_ids("cuda:1", None, True, 2) == [6]
    assert job_gpu_ids("auto", "auto", True, 2) == [4, 6]


@pytest.mark.integration
def test_the_literal_cosine_penalty_runs_with_a_warning_in_the_row_and_the_log(tmp_path, caplog):
    settings = ("objective=cosine", "objective.epochs=1", "regularizer=l2", "alpha=0.01", "save_model=false")
    cfg = job_config(tmp_path, *settings)
    row = run_recorded(cfg)
    assert row["status"] == "finished" and "invariant to T's scale" in row["regularizer_warning"]
    assert any("invariant to T's scale" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    well_posed = ["objective=cosine", "regularizer=l2_to_identity", "alpha=0.01"]
    assert JobSpec.from_config(compose_config(SMOKE + well_posed)).setting_columns()["regularizer_warning"] is None
    with pytest.raises(ConfigError, match="regularizer='l2_to_identity': objective=ls supports none, l2"):
        JobSpec.from_config(compose_config(SMOKE + ["objective=ls", "regularizer=l2_to_identity", "alpha=1"]))


@pytest.mark.unit
def test_the_official_codes_calibration_datasets_have_presets():
    """utils.get_calib_dataloader of the official code: C4 (en), WikiText-2 (raw v1) and
    sec-data-mini, each read from its "text" column."""
    official = {
        "c4": ("allenai/c4", "en"),
        "wikitext2": ("wikitext", "wikitext-2-raw-v1"),
        "sec_data_mini": ("arcee-ai/sec-data-mini", None),
    }
    for name, (dataset, subset) in official.items():
        calibration = compose_config([f"calibration={name}", "calibration.order=first"]).calibration
        assert (calibration.dataset, calibration.subset, calibration.text_field) == (dataset, subset, "text"), name
        assert calibration.source == "hf_dataset" and calibration.order == "first"
