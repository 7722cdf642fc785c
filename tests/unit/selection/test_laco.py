"""LaCo (selection=laco, experiment=laco): the RDSC merge against a hand-written sum over a tiny
model's blocks, the search's tries against a brute-force re-implementation of the official
notebook's loop (deep copies, merged weights, deleted layers, the model's own final hidden
states), its equal-compression stop, and the pruned job's checkpoint (plain, merged weights by
hand, export = full save)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.jobs import job_config
from helpers.laco import params
from helpers.models import tiny_model

from replaceme_exp.data.batching import TokenBatch, TokenBatches
from replaceme_exp.errors import ConfigError
from replaceme_exp.methods.laco import LacoSelectionConfig
from replaceme_exp.models import adapter_for
from replaceme_exp.models.merging import mergeable_state, official_code_merge, rdsc_merge
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.pipeline.rules import check_shape
from replaceme_exp.selection.laco import default_merge_layers, laco_search
from replaceme_exp.selection.search import SearchContext


LLAMA_MERGED = {
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_rdsc_merge_is_the_hand_written_sum_over_the_blocks(family):
    blocks = adapter_for(tiny_model(family, num_layers=4, seed=3)).layers
    states = [mergeable_state(b, ("self_attn", "mlp")) for b in blocks]
    merged = rdsc_merge(states[0], states[1:])
    t = [params(b) for b in blocks]
    expected = {n for n in t[0] if n.startswith(("self_attn.", "mlp."))}
    assert merged.keys() == expected and LLAMA_MERGED <= expected  # qwen2: q/k/v biases too; no norm
    for name in expected:
        hand = t[0][name] + (t[1][name] - t[0][name]) + (t[2][name] - t[0][name]) + (t[3][name] - t[0][name])
        torch.testing.assert_close(merged[name], hand, rtol=1e-6, atol=1e-6, msg=name)
        # the official notebooks' in-place update leaves the last block's weights
        assert torch.equal(official_code_merge(states[0], states[1:])[name], t[3][name])


def test_merge_layers_scale_with_depth_from_the_official_13b_setting():
    assert [default_merge_layers(n) for n in (40, 32, 30, 16, 6, 2)] == [7, 6, 6, 3, 2, 2]


def calibration(vocab: int = 128, seed: int = 0) -> tuple[TokenBatches, list[torch.Tensor]]:
    """Two right-padded batches of sequences of different lengths, and the same sequences unpadded."""
    g = torch.Generator().manual_seed(seed)
    lengths = [[12, 9, 5], [10, 7]]
    batches, sequences = [], []
    for group in lengths:
        ids = torch.zeros(len(group), max(group), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(group):
            seq = torch.randint(1, vocab, (n,), generator=g)
            ids[row, :n], mask[row, :n] = seq, 1
            sequences.append(seq[None])
        batches.append(TokenBatch(ids, mask))
    return TokenBatches(batches, max(max(g) for g in lengths)), sequences


@torch.no_grad()
def brute_force_laco(model, sequences, c, interval, threshold, lowest, highest, n_blocks):
    """The official notebook's loop (laco_llama-13b.ipynb) with Eq. 1 as the merge: a deep copy
    per try, the merged weights written into it, the merged layers deleted, and the mean over
    sequences of the cosine between the flattened last hidden states (``hidden_states[-1]``)."""
    reference = [model(ids, output_hidden_states=True).hidden_states[-1] for ids in sequences]
    current, names = copy.deepcopy(model), list(range(model.config.num_hidden_layers))
    tries, removed, lay = [], 0, highest - c
    while lay >= lowest and removed < n_blocks:
        m = min(c - 1, len(current.model.layers) - lay - 1, n_blocks - removed)
        tmp = copy.deepcopy(current)
        old = [params(layer) for layer in current.model.layers]
        for name, p in tmp.model.layers[lay].named_parameters():
            if name.startswith(("self_attn.", "mlp.")):
                p.copy_(old[lay][name] + sum(old[lay + k][name] - old[lay][name] for k in range(1, m + 1)))
        for k in range(lay + m, lay, -1):
            del tmp.model.layers[k]
        for i, layer in enumerate(tmp.model.layers):
            layer.self_attn.layer_idx = i
        tmp.config.num_hidden_layers = len(tmp.model.layers)
        sims = []
        for ids, ref in zip(sequences, reference):
            out = tmp(ids, output_hidden_states=True, use_cache=False).hidden_states[-1]
            sims.append(torch.nn.functional.cosine_similarity(ref.flatten(), out.flatten(), dim=0))
        value = float(torch.stack(sims).mean())
        tries.append((names[lay], names[lay + 1 : lay + 1 + m], value, value > threshold))
        if value > threshold:
            current, names = tmp, names[: lay + 1] + names[lay + 1 + m :]
            removed += m
            lay -= interval
        else:
            lay -= 1
    return tries, current, names


def search(model, batches, n_blocks, **settings):
    config = LacoSelectionConfig(metric="laco", **settings)
    return laco_search(SearchContext(adapter_for(model), batches, n_blocks, config, 0))


@pytest.mark.parametrize(("threshold", "interval", "merge_layers"), [(0.3, 1, 3), (0.3, 2, 3), (0.2, 1, 4)])
def test_the_search_tries_what_a_brute_force_run_of_the_official_loop_tries(threshold, interval, merge_layers):
    model = tiny_model(num_layers=10, seed=5)
    batches, sequences = calibration()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n_blocks = 7
    result = search(model, batches, n_blocks, merge_layers=merge_layers, interval=interval, threshold=threshold)
    tries, merged_model, kept = brute_force_laco(model, sequences, merge_layers, interval, threshold, 0, 9, n_blocks)

    mine = [(t["start"], t["merged"], t["similarity"], t["accepted"]) for t in result.columns["laco_tries"]]
    assert [(s, m, a) for s, m, _, a in mine] == [(s, m, a) for s, m, _, a in tries]
    assert [v for *_, v, _ in mine] == pytest.approx([v for *_, v, _ in tries], abs=1e-5)
    assert {a for *_, a in mine} == {True, False}  # the sequence both keeps and refuses merges
    assert sorted(result.removed) == sorted(set(range(10)) - set(kept))
    assert result.columns["laco_removed_blocks"] == len(result.removed) == 10 - len(kept)
    # the kept blocks' new weights are the brute force's merged ones
    for position, block in enumerate(kept):
        theirs = params(merged_model.model.layers[position])
        for name, value in result.block_states.get(block, {}).items():
            torch.testing.assert_close(value, theirs[name], rtol=1e-5, atol=1e-6)
        if block not in result.block_states:
            assert all(torch.equal(theirs[n], before[f"model.layers.{block}.{n}"]) for n in theirs)
    # the search left the model as it found it
    after = model.state_dict()
    assert model.config.num_hidden_layers == 10 and all(torch.equal(after[k], before[k]) for k in before)


def test_the_search_stops_at_n_blocks_and_records_a_shortfall():
    model = tiny_model(num_layers=8, seed=1)
    batches, _ = calibration()
    exact = search(model, batches, 5, merge_layers=4, threshold=-1.0)
    # 3 then 2 (the last merge shortened to land on 5), each kept (any cosine > -1)
    assert [len(t["merged"]) for t in exact.columns["laco_tries"]] == [3, 2]
    assert len(exact.removed) == 5 and exact.columns["laco_shortfall"] == 0
    assert exact.columns["laco_merges"] == [{"into": 2, "blocks": [3, 4, 5, 6, 7]}]

    short = search(model, batches, 7, merge_layers=3, lowest=3, threshold=-1.0)
    assert short.columns["laco_removed_blocks"] < 7 == short.columns["laco_target_blocks"]
    assert short.columns["laco_shortfall"] == 7 - len(short.removed) > 0

    with pytest.raises(ConfigError, match=r"^selection\.threshold=0\.99999"):
        search(model, batches, 3, merge_layers=4, threshold=0.99999)


def test_the_preset_names_the_method_and_records_its_settings(tmp_path):
    spec = JobSpec.from_config(job_config(tmp_path, "experiment=laco", "selection.threshold=0.5"))
    columns = spec.setting_columns()
    assert columns["method"] == "LaCo" and columns["selection_metric"] == "laco"
    assert columns["selection_threshold"] == 0.5 and columns["selection_merge"] == "rdsc"
    default = JobSpec.from_config(job_config(tmp_path))
    assert default.setting_columns()["selection_threshold"] is None
    other = JobSpec.from_config(job_config(tmp_path, "experiment=laco"))
    assert other.config_hash != spec.config_hash


def test_the_baichuan_preset_runs_the_notebooks_other_setting_as_the_official_loop_does(tmp_path):
    """experiment=laco_baichuan is laco-baic-13B.ipynb's setting (C = 3, I = 1, T = 0.6, L = 0, H = the
    top block, two sentences) beside experiment=laco's (C scaled from the Llama 2 13B notebook, T = 0.45,
    five sentences); its search on a tiny model tries and keeps what the official loop does on the
    first two calibration sequences."""
    spec = JobSpec.from_config(job_config(tmp_path, "experiment=laco_baichuan"))
    selection = spec.config.selection
    assert (selection.merge_layers, selection.interval, selection.threshold) == (3, 1, 0.6)
    assert (selection.lowest, selection.highest, selection.samples, selection.merge) == (0, None, 2, "rdsc")
    columns = spec.setting_columns()
    assert columns["method"] == "LaCo" and columns["selection_merge_layers"] == 3
    paper = JobSpec.from_config(job_config(tmp_path, "experiment=laco")).config.selection
    assert (paper.merge_layers, paper.threshold, paper.samples) == (None, 0.45, 5)

    model = tiny_model(num_layers=10, seed=0)
    batches, sequences = calibration()
    settings = {k: getattr(selection, k) for k in ("merge_layers", "interval", "threshold", "samples")}
    result = search(model, batches, 4, **settings)
    tries, _, kept = brute_force_laco(model, sequences[:2], 3, 1, 0.6, 0, 9, 4)
    mine = [(t["start"], t["merged"], t["accepted"]) for t in result.columns["laco_tries"]]
    assert mine == [(s, m, a) for s, m, _, a in tries] and any(a for *_, a in mine)
    assert [t["similarity"] for t in result.columns["laco_tries"]] == pytest.approx([v for *_, v, _ in tries], abs=1e-5)
    assert sorted(result.removed) == sorted(set(range(10)) - set(kept))
    assert (result.columns["laco_merge_layers"], result.columns["laco_samples"]) == (3, 2)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("selection.highest=6", "selection.highest"),  # the tiny job's model has blocks 0..5
        ("selection.lowest=4 selection.highest=3", "selection.lowest"),
        ("selection.threshold=1.5", "selection.threshold"),
        ("selection.merge_layers=1", "selection.merge_layers"),
        ("selection.merge=average", "selection.merge"),
    ],
)
def test_bad_laco_settings_fail_in_one_line_before_the_model_loads(tmp_path, override, key):
    config = job_config(tmp_path, "experiment=laco", *override.split())
    with pytest.raises(ConfigError, match=rf"^{key}="):
        spec = JobSpec.from_config(config)
        check_shape(spec.config, model_shape(spec.config.model, spec.config.cache_dir))
