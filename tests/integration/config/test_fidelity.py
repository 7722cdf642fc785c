"""Numbers a researcher can trust: equivalent spellings hash equal, caches keyed by weights
content and code semantics, cached stages recorded, the official pipeline's preset and loader,
masking as augmentation, the 4-bit option's refusal, CodeCarbon on the job's own GPUs."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.jobs import SMOKE, job_config
from helpers.models import tiny_model

from replaceme_exp.capture import LinearStatistics, run_capture
from replaceme_exp.data.augmentation import with_masked_copies
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded


def save_local_checkpoint(path, init_seed: int, tokenizer) -> None:
    model = tiny_model("llama", num_layers=6, seed=init_seed, vocab=len(tokenizer))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


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


@pytest.mark.slow
def test_force_recomputes_caches_and_rows_say_what_was_cached(tmp_path):
    first = run_recorded(job_config(tmp_path, "save_model=false"))
    assert first["status"] == "finished" and first["cached_stages"] == []
    second = run_recorded(job_config(tmp_path, "save_model=false", "alpha=2"))
    assert {"selection", "statistics", "baseline_ppl"} <= set(second["cached_stages"])
    forced = run_recorded(job_config(tmp_path, "save_model=false", "alpha=2", "force=true"))
    assert forced["status"] == "finished" and forced["cached_stages"] == []
    assert forced["time_capture_s"] > 0


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


@pytest.mark.slow
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
