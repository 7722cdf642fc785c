"""Layer-wise capture equals whole-model capture; the capture plan; float32 statistics."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.jobs import job_config
from helpers.layerwise import CPU, layerwise
from helpers.models import FAMILY_CONFIGS, MORE_FAMILY_CONFIGS, tiny_model
from safetensors.torch import load_file

from replaceme_exp.capture import CutDistances, LayerDistances, LinearStatistics, TransformDistances, run_capture
from replaceme_exp.capture.execution import GIB, CaptureExecution
from replaceme_exp.capture.layerwise import catch_block_inputs
from replaceme_exp.capture.similarity import SimilarityStatistics, linear_cka_per_cut
from replaceme_exp.capture.statistics import TokenCollector, cosine_distance
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.estimation import ridge_solve
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.selection.passes import candidate_groups
from replaceme_exp.surgery import attach_separate_transforms


CUTS = [(1, 3), (2, 5), (4, 6), (5, 8)]


FAMILIES = sorted({**FAMILY_CONFIGS, **MORE_FAMILY_CONFIGS})


def capture_everything(adapter, batches, placement: str, execution: CaptureExecution | None = None):
    """Every kind of statistic at once, captured as ``execution`` says (None: whole-model): LS
    statistics, distances, CKA/CCA moments, the layer distance matrix, held-out transform checks and
    a token store."""
    linear = LinearStatistics(CUTS, adapter.hidden_size, CPU, placement)
    distances = CutDistances(CUTS, cosine_distance)
    similarity = SimilarityStatistics(CUTS, adapter.hidden_size, CPU)
    layers = LayerDistances(adapter.num_layers)
    transform = torch.eye(adapter.hidden_size) + 0.01 * torch.randn(
        adapter.hidden_size, adapter.hidden_size, generator=torch.Generator().manual_seed(0)
    )
    check = TransformDistances({(2, 5): transform}, placement)
    store = TokenStore(("M", "R", "Y"), batches.n_tokens, adapter.hidden_size, CPU, location="cpu", dtype=torch.float32)
    collector = TokenCollector((2, 5), store, placement)
    run_capture(adapter, batches, [linear, distances, similarity, layers, check, collector], execution=execution)
    return {
        "stats": linear.result(),
        "distances": distances.result(),
        "cka": linear_cka_per_cut(similarity),
        "layers": torch.tensor(layers.result()),
        "check": check.result(),
        "store": {name: t[: collector.offset].clone() for name, t in store.tensors.items()},
    }


def assert_same_capture(a: dict, b: dict) -> None:
    for cut in CUTS:
        assert torch.equal(a["stats"][cut].mtm, b["stats"][cut].mtm)
        assert torch.equal(a["stats"][cut].mtr, b["stats"][cut].mtr)
        assert a["stats"][cut].r_sq == b["stats"][cut].r_sq
        assert a["stats"][cut].n_tokens == b["stats"][cut].n_tokens > 0
    assert a["distances"] == b["distances"]
    assert a["cka"] == b["cka"]
    assert torch.equal(a["layers"], b["layers"])
    assert a["check"] == pytest.approx(b["check"], rel=1e-12)
    for name in a["store"]:
        assert torch.equal(a["store"][name], b["store"][name])


@pytest.mark.parametrize("family", FAMILIES)
def test_layerwise_capture_equals_the_whole_model_capture_for_every_family(family):
    # Gemma 2/3 and Qwen 2 (sliding_window 4, sequences up to 20 tokens) give blocks different masks.
    adapter = adapter_for(tiny_model(family, num_layers=8))
    batches = batches_of(random_sequences(10, 5, 20, seed=1), 4, side="left")
    placement = "separate" if adapter.unfusable_reason else "fused"
    whole = capture_everything(adapter, batches, placement)
    assert_same_capture(whole, capture_everything(adapter, batches, placement, layerwise()))


@pytest.mark.parametrize("location,chunk", [("gpu", None), ("cpu", 2), ("disk", 1)])
def test_every_store_location_and_chunking_gives_the_same_statistics(location, chunk):
    adapter = adapter_for(tiny_model("llama", num_layers=8))
    batches = batches_of(random_sequences(10, 5, 20, seed=2), 3)
    whole = capture_everything(adapter, batches, "fused")
    assert_same_capture(
        whole, capture_everything(adapter, batches, "fused", layerwise(store=location, chunk_batches=chunk))
    )


def test_separate_transforms_attached_to_blocks_act_in_a_layerwise_capture():
    """A sequential multi-LT job captures on a model with T hooks from earlier stages."""
    adapter = adapter_for(tiny_model("llama", num_layers=8))
    generator = torch.Generator().manual_seed(3)
    attach_separate_transforms(adapter, {2: torch.eye(32) + 0.1 * torch.randn(32, 32, generator=generator)})
    batches = batches_of(random_sequences(6, 5, 16, seed=3), 3)
    whole = capture_everything(adapter, batches, "fused")
    assert_same_capture(whole, capture_everything(adapter, batches, "fused", layerwise()))


def test_the_catch_runs_no_block_and_records_each_blocks_own_mask():
    adapter = adapter_for(tiny_model("gemma2", num_layers=4))
    batch = next(iter(batches_of(random_sequences(2, 12, 12, seed=4), 2)))
    calls = []
    handle = adapter.mlp(0).register_forward_hook(lambda *args: calls.append(1))
    hidden, block_calls = catch_block_inputs(adapter, batch, last_block=3)
    handle.remove()
    assert calls == [] and hidden.shape == (2, 12, 32) and len(block_calls) == 4
    assert "forward" not in vars(adapter.layers[0])  # the recorders are gone
    masks = [kwargs["attention_mask"] for _, kwargs in block_calls]
    assert adapter.config.layer_types[:2] == ["sliding_attention", "full_attention"]
    assert not torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])


@pytest.mark.slow
def test_a_layerwise_job_selects_estimates_and_prunes_as_the_whole_model_job(tmp_path):
    rows, weights = {}, {}
    for mode in ("whole", "layerwise"):
        out = tmp_path / mode
        cfg = job_config(out, f"capture.mode={mode}", "capture.device=cpu", "eval.samples=null", "save_model=full")
        rows[mode] = run_recorded(cfg)
        weights[mode] = load_file(f"{rows[mode]['pruned_model_path']}/model.safetensors")
    whole, lw = rows["whole"], rows["layerwise"]
    assert lw["capture_mode"] == "layerwise" and whole["capture_mode"] == "whole"
    assert "capture.mode=layerwise" in lw["capture_plan"]
    assert lw["config_hash"] == whole["config_hash"]  # how a capture runs does not change what it computes
    assert lw["cuts"] == whole["cuts"]
    assert lw["candidate_distances"] == whole["candidate_distances"]
    for key in ("cos_dist_before", "cos_dist_after", "ppl_heldout"):
        assert lw[key] == pytest.approx(whole[key], rel=1e-12)
    assert weights["whole"].keys() == weights["layerwise"].keys()
    for name, tensor in weights["whole"].items():
        assert torch.equal(tensor, weights["layerwise"][name]), name


@pytest.mark.slow
def test_ls_residual_selection_splits_candidates_into_passes_that_fit_the_budget(tmp_path):
    cut_bytes = 2 * 64 * 64 * 8
    request = JobSpec.from_config(compose_config([f"capture.max_stats_gb={2.5 * cut_bytes / GIB}"])).selection_request()
    groups = candidate_groups(request, 64, [(s, s + 2) for s in range(1, 5)])
    assert [len(g) for g in groups] == [2, 2]
    one = run_recorded(job_config(tmp_path / "one", "selection=ls_residual", "capture.passes=one", "save_model=false"))
    split = run_recorded(
        job_config(
            tmp_path / "split", "selection=ls_residual", f"capture.max_stats_gb={cut_bytes / GIB}", "save_model=false"
        )
    )
    assert split["cuts"] == one["cuts"]
    assert [c[:2] for c in split["candidate_distances"]] == [c[:2] for c in one["candidate_distances"]]
    assert [c[2] for c in split["candidate_distances"]] == pytest.approx([c[2] for c in one["candidate_distances"]])
    assert "capture (selection, 4/4)" in split["stage_seconds"]


def test_float32_statistics_stay_within_the_tested_bound_of_float64():
    """float32 products per batch, float64 sums: relative error below 1e-6 on the statistics and
    below 1e-4 on the ridge-LS transform of a tiny model's real activations."""
    adapter = adapter_for(tiny_model("llama", num_layers=8))
    batches = batches_of(random_sequences(64, 20, 40, seed=5), 8)
    exact = LinearStatistics(CUTS, adapter.hidden_size, CPU, precision="float64")
    fast = LinearStatistics(CUTS, adapter.hidden_size, CPU, precision="float32")
    similarity = {p: SimilarityStatistics(CUTS, adapter.hidden_size, CPU, p) for p in ("float64", "float32")}
    run_capture(adapter, batches, [exact, fast, *similarity.values()])
    for cut in CUTS:
        a, b = exact.result()[cut], fast.result()[cut]
        assert b.mtm.dtype == torch.float64
        for x, y in ((a.mtm, b.mtm), (a.mtr, b.mtr)):
            error = float((x - y).norm() / x.norm())
            assert 0 < error < 1e-6
        ta, tb = ridge_solve(a, 1e-3), ridge_solve(b, 1e-3)
        assert float((ta - tb).norm() / ta.norm()) < 1e-4
    cka = {p: linear_cka_per_cut(s) for p, s in similarity.items()}
    assert cka["float32"] == pytest.approx(cka["float64"], abs=1e-6)
