"""Jobs and sweeps: config composition, rows, skipping finished jobs, failed rows, caches."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers.config import CACHE, compose_config, config_hash
from helpers.jobs import SMOKE, job_config

from replaceme_exp.config.validate import typed_config
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded


REQUIRED_COLUMNS = (
    "run_id sweep_id config_hash status error model num_layers calibration n_calib_samples calib_seq_len objective "
    "regularizer alpha num_lts n_prune cuts compression_ratio params_before params_after cos_dist_before "
    "cos_dist_after ppl_heldout ppl_heldout_baseline time_capture_s time_estimate_s time_eval_s peak_mem_gb device "
    "pruned_model_path dtype healing l2_dist_before"
).split()


@pytest.mark.slow
def test_tiny_job_writes_a_complete_row_and_a_loadable_model(tmp_path):
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=full")
    row = run_recorded(cfg, sweep_id="t")
    assert row["status"] == "finished", row["error"]
    table = ResultsStore(tmp_path).load()
    assert len(table) == 1
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    assert not missing
    stored = table.iloc[0]
    assert json.loads(stored["cuts"]) == [[2, 4]] and stored["n_prune"] == 2 and stored["num_layers"] == 6
    assert stored["params_after"] < stored["params_before"] and 0 < stored["compression_ratio"] < 1
    assert stored["time_capture_s"] > 0 and stored["ppl_heldout"] > 1
    assert (
        stored["train_loss"] == pytest.approx(json.loads(stored["cut_train_losses"])["2-4"])
        and stored["train_loss"] > 0
    )
    assert pd.isna(stored["candidate_distances"])  # explicit cuts: no selection
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(stored["pruned_model_path"]).config.num_hidden_layers == 4


@pytest.mark.slow
def test_finished_jobs_are_skipped_and_failed_jobs_leave_a_row(tmp_path, caplog):
    ok = job_config(tmp_path, "save_model=false")
    first = run_recorded(ok)
    assert first["status"] == "finished"
    with caplog.at_level("DEBUG"):
        again = run_recorded(ok)
    assert again["status"] == "skipped" and "skipping" in caplog.text and again["run_id"] == first["run_id"]
    forced = run_recorded(job_config(tmp_path, "save_model=false", "force=true"))
    assert forced["status"] == "finished" and forced["run_id"] != first["run_id"]

    bad = job_config(tmp_path, "n_prune=9")
    row = run_recorded(bad, raise_on_failure=False)
    assert row["status"] == "failed" and "n_prune=9" in row["error"] and "6 blocks" in row["error"]
    table = ResultsStore(tmp_path).load()
    assert sorted(table["status"]) == ["failed", "finished", "finished"]
    with pytest.raises(Exception, match="cuts="):
        run_recorded(job_config(tmp_path, "cuts=[[3,9]]"))
    assert len(ResultsStore(tmp_path).load()) == 4


@pytest.mark.parametrize(
    "override, message",
    [
        ("calibration.n_samples=1", "at least 64 are needed"),
        ("regularizer=none", "alpha=0.5: has no effect with regularizer=none"),
        ("calibration=text_file", "calibration.path=None"),
    ],
)
def test_bad_input_fails_with_the_key_and_value(tmp_path, override, message):
    overrides = [override, "calibration.seq_len=16", "cuts=[[2,4]]"]
    if override == "regularizer=none":
        overrides.append("alpha=0.5")
    row = run_recorded(job_config(tmp_path, *overrides), raise_on_failure=False)
    assert row["status"] == "failed"
    assert message in row["error"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["text_file", "jsonl_chat"])
def test_jobs_calibrate_on_a_users_own_data(tmp_path, kind):
    if kind == "text_file":
        path = tmp_path / "own.txt"
        path.write_text("\n\n".join(f"My own paragraph {i} on depth pruning and linear maps. " * 6 for i in range(60)))
        overrides = ["calibration=text_file", f"calibration.path={path}"]
    else:
        path = tmp_path / "own.jsonl"
        turns = lambda i: [
            {"role": "user", "content": f"Question {i} about blocks?"},
            {"role": "assistant", "content": "An answer. " * 20},
        ]  # noqa: E731
        path.write_text("\n".join(json.dumps({"messages": turns(i)}) for i in range(40)))
        overrides = ["calibration=jsonl", f"calibration.path={path}"]
    row = run_recorded(job_config(tmp_path, *overrides, "calibration.n_samples=32", "save_model=false"))
    assert row["status"] == "finished" and row["calibration"] in ("text_file", "jsonl")
    assert row["n_calib_tokens"] > 64 and row["cos_dist_after"] >= 0
    assert row["chat_template"] is True  # SmolLM2's tokenizer renders the jsonl chats with its template


@pytest.mark.slow
@pytest.mark.parametrize("selection", ["ls_residual", "l2", "uidl"])
def test_selection_metric_is_recorded_and_followed(tmp_path, selection):
    row = run_recorded(job_config(tmp_path, f"selection={selection}", "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["selection_metric"] == {"uidl": "angular_last"}.get(selection, selection)
    profile = row["candidate_distances"]
    assert len(profile) == 4 and row["cuts"] == [min(profile, key=lambda c: c[2])[:2]]
    if selection == "ls_residual":  # the residual is computed in the selection pass: no second pass
        assert row["selection_distance"] == pytest.approx(min(c[2] for c in profile))


@pytest.mark.parametrize("structure", ["diagonal", "orthonormal"])
@pytest.mark.slow
def test_structured_transforms_run_end_to_end(tmp_path, structure):
    row = run_recorded(job_config(tmp_path, f"structure={structure}", "cuts=[[2,4]]", "save_model=false"))
    assert row["status"] == "finished", row["error"]
    assert row["structure"] == structure and row["cos_dist_after"] != row["cos_dist_before"]


@pytest.mark.parametrize(
    "objective, extra",
    [
        ("cosine", ["objective.init=ls"]),
        ("cosine_exact", ["regularizer=l1", "alpha=1e-4"]),
        ("cosine", ["mask_ratio=0.25", "structure=diagonal"]),
    ],
)
@pytest.mark.slow
def test_numerical_objectives_run_end_to_end(tmp_path, objective, extra):
    row = run_recorded(
        job_config(tmp_path, f"objective={objective}", "objective.epochs=2", "cuts=[[2,4]]", "save_model=false", *extra)
    )
    assert row["status"] == "finished", row["error"]
    assert row["solver"] == "adam" and row["store_location"] == "cpu" and row["train_loss"] > 0
    assert list(row["loss_curves"]) == ["2-4"] and len(row["loss_curves"]["2-4"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["ls", "cosine"])
def test_separate_placement_is_evaluated_in_memory_and_flagged(tmp_path, objective):
    row = run_recorded(
        job_config(
            tmp_path,
            "lt_placement=separate",
            "save_model=full",
            f"objective={objective}",
            "objective.epochs=1" if objective == "cosine" else "alpha=0",
        )
    )
    assert row["status"] == "finished", row["error"]
    assert row["lt_placement"] == "separate" and row["plain_checkpoint"] is False
    assert (Path(row["pruned_model_path"]) / "separate_transforms.safetensors").is_file()
    if objective == "ls":
        fused = run_recorded(job_config(tmp_path, "save_model=false"))
        assert fused["plain_checkpoint"] is True and fused["cuts"] == row["cuts"]
        assert fused["ppl_heldout"] != row["ppl_heldout"]


@pytest.mark.slow
def test_sequential_multi_lt_estimates_each_transform_on_the_partly_pruned_model(tmp_path):
    import copy

    from replaceme_exp.capture import LinearStatistics, run_capture
    from replaceme_exp.data import build_calibration
    from replaceme_exp.estimation import ridge_solve
    from replaceme_exp.models import adapter_for, load_model
    from replaceme_exp.surgery import load_pruned, prune

    cuts = "cuts=[[1,2],[3,5]]"
    sequential = run_recorded(job_config(tmp_path, cuts, "multi_lt=sequential", "save_model=full"))
    independent = run_recorded(job_config(tmp_path, cuts, "multi_lt=independent", "save_model=full"))
    assert sequential["status"] == independent["status"] == "finished"
    assert sequential["multi_lt"] == "sequential" and sequential["kept_blocks"] == [0, 2, 5]
    assert sorted(sequential["cut_train_losses"]) == ["1-2", "3-5"]

    cfg = job_config(tmp_path, cuts)
    loaded = load_model(cfg.model, str(CACHE))
    calibration = build_calibration(cfg.calibration, loaded.tokenizer)
    expected = copy.deepcopy(loaded.model)
    adapter = adapter_for(expected)
    for cut in [(1, 2), (2, 4)]:  # the second cut, [3, 5), sits at [2, 4) once block 1 is gone
        stats = LinearStatistics([cut], adapter.hidden_size, torch.device("cpu"))
        run_capture(adapter, calibration, [stats])
        prune(adapter, [cut], {cut: ridge_solve(stats.result()[cut])})
    ids = torch.randint(0, 1000, (1, 12))
    saved_sequential = load_pruned(sequential["pruned_model_path"]).eval()
    torch.testing.assert_close(saved_sequential(ids).logits, expected(ids).logits, rtol=1e-4, atol=1e-4)
    saved_independent = load_pruned(independent["pruned_model_path"]).eval()
    assert not torch.allclose(saved_independent(ids).logits, expected(ids).logits, atol=1e-4)


@pytest.mark.slow
def test_numerical_objectives_apply_their_regulariser(tmp_path):
    common = ["objective=cosine", "objective.epochs=2", "objective.lr=1e-2", "cuts=[[2,4]]", "save_model=false"]
    plain = run_recorded(job_config(tmp_path, *common))
    l1 = run_recorded(job_config(tmp_path, *common, "regularizer=l1", "alpha=1e-3"))
    assert plain["regularizer"] == "none" and l1["regularizer"] == "l1"
    assert l1["train_loss"] > plain["train_loss"]  # the reported loss includes the L1 penalty


@pytest.mark.slow
def test_an_ls_start_for_a_numerical_objective_costs_no_extra_pass(tmp_path, monkeypatch):
    import replaceme_exp.estimation.fitting as fitting
    import replaceme_exp.selection.passes as planning

    passes = []
    for module in (fitting, planning):
        original = module.run_capture

        def counted(adapter, batches, statistics, desc="capture", execution=None, _original=original):
            passes.append(desc)
            return _original(adapter, batches, statistics, desc=desc, execution=execution)

        monkeypatch.setattr(module, "run_capture", counted)
    row = run_recorded(
        job_config(tmp_path, "objective=cosine", "objective.init=ls", "objective.epochs=1", "cuts=[[2,4]]")
    )
    assert row["status"] == "finished", row["error"]
    assert [p for p in passes if "held-out" not in p] == ["capture (tokens)"]


@pytest.mark.slow
def test_layer_distances_ride_on_the_selection_pass_and_are_cached(tmp_path, monkeypatch):
    """The matrix joins the selection pass (no pass of its own), a second job reads it from the
    cache, and a job with explicit cuts (no selection pass) runs one pass for it; all three equal
    a standalone LayerDistances capture over the same calibration batches."""
    import replaceme_exp.pipeline.job as job
    import replaceme_exp.selection.passes as planning
    from replaceme_exp.capture import LayerDistances, run_capture
    from replaceme_exp.data import build_calibration
    from replaceme_exp.models import adapter_for, load_model

    passes = []
    for module in (job, planning):
        original = module.run_capture

        def counted(adapter, batches, statistics, desc="capture", execution=None, _original=original):
            passes.append(desc)
            return _original(adapter, batches, statistics, desc=desc, execution=execution)

        monkeypatch.setattr(module, "run_capture", counted)

    first = run_recorded(job_config(tmp_path, "record_layer_distances=true", "save_model=false"))
    assert first["status"] == "finished", first["error"]
    assert [p for p in passes if "held-out" not in p] == ["capture (selection)"]
    passes.clear()
    again = run_recorded(job_config(tmp_path, "record_layer_distances=true", "save_model=false", "alpha=3"))
    assert [p for p in passes if "held-out" not in p] == [] and again["layer_distances"] == first["layer_distances"]
    passes.clear()
    fresh = tmp_path / "fresh"
    explicit = run_recorded(job_config(fresh, "record_layer_distances=true", "save_model=false", "cuts=[[2,4]]"))
    assert [p for p in passes if "held-out" not in p] == ["capture (statistics)", "layer distances"]

    cfg = typed_config(job_config(tmp_path))
    loaded = load_model(cfg.model, cfg.cache_dir)
    reference = LayerDistances(len(first["layer_distances"]))
    run_capture(adapter_for(loaded.model), build_calibration(cfg.calibration, loaded.tokenizer), [reference])
    for matrix in (first["layer_distances"], explicit["layer_distances"]):
        assert torch.allclose(torch.tensor(matrix), torch.tensor(reference.result()), atol=1e-6)


@pytest.mark.slow
def test_save_transforms_writes_each_cuts_t_which_the_checkpoint_holds_fused(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from replaceme_exp.models import adapter_for, load_model

    row = run_recorded(job_config(tmp_path, "cuts=[[2,4]]", "save_transforms=true", "save_model=full"))
    assert row["status"] == "finished"
    saved = load_file(row["transforms_path"])
    assert set(saved) == {"2-4"} and saved["2-4"].dtype == torch.float64 and saved["2-4"].shape == (64, 64)
    # the checkpoint's fusion target (block 1, before the cut) holds T^T W of the unpruned model's W
    unpruned = load_model(job_config(tmp_path, "cuts=[[2,4]]").model, str(CACHE)).model
    weight = adapter_for(unpruned).fusion_target(1).weight.double()
    pruned = AutoModelForCausalLM.from_pretrained(row["pruned_model_path"])
    fused = adapter_for(pruned).fusion_target(1).weight.double()
    torch.testing.assert_close(fused, saved["2-4"].T @ weight, rtol=1e-5, atol=1e-6)
    # where a job writes is not what it computes
    assert config_hash(compose_config(SMOKE + ["save_transforms=true"])) == config_hash(compose_config(SMOKE))
