"""Speed and memory of a pruned model against the unpruned one (replaceme_exp/evaluation/speed.py):
checked on structure, never on absolute time. A counting clock (the number of forward calls so far)
shows what each timed region contains; parameters and checkpoint bytes are checked against a count
from the config and against the files a save writes; the decode loop against greedy decoding
without a cache."""

from __future__ import annotations

import copy
import json
import statistics
import struct
from functools import partial

import pytest
import torch
from helpers.explicit_modules import random_transform
from helpers.models import FAMILY_CONFIGS, tiny_model

from replaceme_exp.config.schema import SpeedConfig
from replaceme_exp.errors import ConfigError
from replaceme_exp.evaluation.speed import checkpoint_bytes, compare_speed, parameter_count, timed_run
from replaceme_exp.models import adapter_for
from replaceme_exp.models.merging import mergeable_state, rdsc_merge
from replaceme_exp.models.replacement import ReplacementFFN
from replaceme_exp.surgery import prune, save_checkpoint


SMALL = dict(prompt_len=8, gen_len=5, batch=3, rounds=3, warmup=1)


class Calls:
    """Every top-level forward of the watched models, in order: (model name, input_ids, the cache's
    length before the call or None without a cache, use_cache). :meth:`clock` counts them."""

    def __init__(self, models: dict):
        self.calls: list[tuple[str, torch.Tensor, int | None, bool]] = []
        self.handles = [m.register_forward_pre_hook(partial(self.hook, n), with_kwargs=True) for n, m in models.items()]

    def hook(self, name, module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        length = None if cache is None else cache.get_seq_length()
        self.calls.append((name, kwargs["input_ids"].clone(), length, kwargs.get("use_cache")))

    def clock(self) -> float:
        return float(len(self.calls))

    def prefills(self, prompt_len: int) -> list[tuple[str, tuple[int, ...]]]:
        return [
            (n, tuple(ids.shape)) for n, ids, cache, _ in self.calls if cache is None and ids.shape[1] == prompt_len
        ]


def pruned_kinds() -> dict:
    """An unpruned 6-block tiny llama and its pruned copies: plain removal, fused T, separate T,
    LLM-Streamline's FFN, LaCo-style merged blocks (block 1 holding blocks 1..3, 2..3 removed)."""
    base = tiny_model("llama", 6, seed=1)
    models = {"unpruned": base}
    cut = (2, 4)
    for kind in ("plain", "fused", "separate", "ffn", "merged"):
        model = copy.deepcopy(base)
        adapter = adapter_for(model)
        transform = {cut: random_transform(32, 5)} if kind in ("fused", "separate") else {cut: None}
        networks = {1: ReplacementFFN(32, 2)} if kind == "ffn" else None
        states = None
        if kind == "merged":
            blocks = adapter.layers
            later = [mergeable_state(blocks[i], adapter.merged_modules) for i in (2, 3)]
            states = {1: rdsc_merge(mergeable_state(blocks[1], adapter.merged_modules), later)}
        placement = "separate" if kind == "separate" else "fused"
        prune(adapter, [cut], transform, placement=placement, block_states=states, networks=networks)
        models[kind] = model
    return models


def test_the_timed_regions_hold_one_prefill_and_exactly_gen_len_cached_steps():
    """With a clock that counts forward calls, each prefill measures 1 and each decode loop gen_len:
    the decode timing excludes the prefill and the loop runs gen_len steps."""
    models = {"unpruned": tiny_model("llama", 4, seed=1), "pruned": tiny_model("llama", 2, seed=1)}
    calls = Calls(models)
    comparison = compare_speed(models, SpeedConfig(**{**SMALL, "rounds": 2}), clock=calls.clock)
    for speed in comparison.models.values():
        assert speed.seconds == {"prefill": [1.0] * 2, "decode_b1": [5.0] * 2, "decode_batch": [5.0] * 2}
        assert speed.tokens == {"prefill": 3 * 8, "decode_b1": 5, "decode_batch": 3 * 5}
    # every forward asks for the cache; every run: a prefill of the prompt without a cache, then 5 steps
    # of one token each, fed the cache of prompt + the tokens before
    assert all(use_cache for *_, use_cache in calls.calls)
    runs = [calls.calls[i : i + 6] for i in range(0, len(calls.calls), 6)]
    assert len(runs) * 6 == len(calls.calls) == 2 * (2 * (1 + 2) + 1) * 6  # 2 models, 2 runs a round, memory
    for run in runs:
        (name, ids, cache, _), steps = run[0], run[1:]
        assert cache is None and ids.shape[1] == 8 and ids.shape[0] in (1, 3)
        assert [(n, tuple(i.shape), c) for n, i, c, _ in steps] == [(name, (ids.shape[0], 1), 8 + t) for t in range(5)]


def test_models_alternate_on_the_same_token_ids_after_a_warm_up():
    models = {"a": tiny_model("llama", 2, seed=1), "b": tiny_model("llama", 3, seed=2)}
    calls = Calls(models)
    comparison = compare_speed(models, SpeedConfig(**{**SMALL, "rounds": 4}), clock=calls.clock)
    visit = {"a": [("a", (1, 8)), ("a", (3, 8))], "b": [("b", (1, 8)), ("b", (3, 8))]}
    warmup, forward, backward = visit["a"] + visit["b"], visit["a"] + visit["b"], visit["b"] + visit["a"]
    memory = [("a", (3, 8)), ("b", (3, 8))]
    assert calls.prefills(8) == warmup + forward + backward + forward + backward + memory
    assert comparison.orders == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    prompts = [(n, ids) for n, ids, cache, _ in calls.calls if cache is None]
    for n, ids in prompts:
        same_shape = next(i for m, i in prompts if m != n and i.shape == ids.shape)
        assert torch.equal(ids, same_shape)


def test_reported_medians_are_the_medians_of_the_kept_rounds():
    models = {"unpruned": tiny_model("llama", 3, seed=1), "pruned": tiny_model("llama", 2, seed=1)}
    row = compare_speed(models, SpeedConfig(**{**SMALL, "rounds": 4})).row()
    kept = json.loads(row["speed_round_times"])
    assert kept["order"] == [["unpruned", "pruned"], ["pruned", "unpruned"]] * 2
    for metric, tokens in (("prefill", 3 * 8), ("decode_b1", 5), ("decode_batch", 3 * 5)):
        base, sub = kept["unpruned"][f"{metric}_s"], kept["pruned"][f"{metric}_s"]
        assert len(base) == len(sub) == 4 and all(s > 0 for s in base + sub)
        assert row[f"speed_{metric}_tok_s"] == pytest.approx(tokens / statistics.median(sub), rel=1e-12)
        assert row[f"speed_{metric}_tok_s_baseline"] == pytest.approx(tokens / statistics.median(base), rel=1e-12)
        paired = [b / s for b, s in zip(base, sub)]
        assert row[f"speed_{metric}_speedup_min"] == pytest.approx(min(paired), rel=1e-12)
        assert row[f"speed_{metric}_speedup_max"] == pytest.approx(max(paired), rel=1e-12)
        assert min(paired) * 0.999 <= row[f"speed_{metric}_speedup"] <= max(paired) * 1.001
    assert row["speed_prompt_len"] == 8 and row["speed_gen_len"] == 5 and row["speed_batch"] == 3
    assert row["speed_warmup"] == 1 and row["speed_device"] == "cpu" and row["speed_dtype"] == "float32"
    assert row["speed_threads"] == torch.get_num_threads() and row["speed_memory_method"] == "profiler_memory_events"


def kv_cache_bytes(model, batch: int, length: int) -> int:
    c = model.config
    return (
        2 * c.num_hidden_layers * batch * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * length * 4
    )


def test_peak_working_memory_holds_the_kv_cache_and_shrinks_with_the_blocks():
    models = {"unpruned": tiny_model("llama", 6, seed=1), "pruned": tiny_model("llama", 3, seed=1)}
    comparison = compare_speed(models, SpeedConfig(**SMALL))
    work = {n: s.peak_work_bytes for n, s in comparison.models.items()}
    for name, model in models.items():
        assert work[name] >= kv_cache_bytes(model, 3, 8 + 5)
    assert work["pruned"] < work["unpruned"]
    row = comparison.row()
    assert row["peak_infer_mem_ratio"] < 1 and row["peak_infer_work_gb"] == work["pruned"] / 2**30


def counted_parameters(config, extra: int = 0) -> int:
    """Parameters of a tiny llama from its config (no biases): embeddings, the blocks' projections
    and norms, the final norm and an untied head."""
    h, i, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    block = h * h + 2 * h * kv + h * h + 3 * h * i + 2 * h
    head = 0 if config.tie_word_embeddings else vocab * h
    return vocab * h + layers * block + h + head + extra


def tensor_bytes_on_disk(folder) -> int:
    """Bytes of tensor data in the safetensors files under ``folder``: each file less its 8-byte
    length and its JSON header."""
    total = 0
    for path in folder.glob("*.safetensors"):
        data = path.read_bytes()
        total += len(data) - 8 - struct.unpack("<Q", data[:8])[0]
    return total


def test_parameters_and_checkpoint_bytes_against_the_config_and_the_saved_files(tmp_path, smollm2_tokenizer):
    models = pruned_kinds()
    models["tied"] = tiny_model("llama", 6, seed=1, tie_word_embeddings=True)
    models["bfloat16_separate"] = copy.deepcopy(models["separate"]).to(torch.bfloat16)
    extra = {"separate": 32 * 32, "bfloat16_separate": 32 * 32, "ffn": 32 * 64 + 64 + 64 * 32 + 32}
    for name, model in models.items():
        assert parameter_count(model) == counted_parameters(model.config, extra.get(name, 0)), name
        save_checkpoint(model, smollm2_tokenizer, tmp_path / name, {})
        assert checkpoint_bytes(model) == tensor_bytes_on_disk(tmp_path / name), name
    assert models["unpruned"].config.num_hidden_layers == 6 and models["merged"].config.num_hidden_layers == 4
    # tied embeddings once: the head adds nothing
    assert parameter_count(models["tied"]) == parameter_count(models["unpruned"]) - 128 * 32
    # bfloat16 weights take half the bytes; the separate T keeps its own dtype beside them
    own, t_bytes = counted_parameters(models["separate"].config), random_transform(32, 5).element_size()
    assert checkpoint_bytes(models["bfloat16_separate"]) == 2 * own + t_bytes * 32 * 32
    assert checkpoint_bytes(models["separate"]) == 4 * own + t_bytes * 32 * 32


def test_every_kind_of_pruned_model_decodes_greedily_from_its_cache():
    """The decode loop's tokens equal greedy decoding that recomputes the whole sequence each step,
    on plain, fused-T, separate-T, FFN-replaced and merged-block models, and every kind runs in a
    comparison."""
    models = pruned_kinds()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(3))
    for name, model in models.items():
        with torch.inference_mode():
            run = timed_run(model, ids, 6, clock=lambda: 0.0)
            sequence = ids
            for _ in range(7):
                logits = model(input_ids=sequence, use_cache=False).logits
                sequence = torch.cat([sequence, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(run.tokens, sequence[:, 8:]), name
    comparison = compare_speed(models, SpeedConfig(**{**SMALL, "rounds": 1, "warmup": 0}))
    for name in models:
        if name != "unpruned":
            row = comparison.row(name, "unpruned")
            assert row["param_count_ratio"] < 1 and row["checkpoint_bytes_ratio"] < 1, name


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_each_family_compares_after_pruning(family):
    base = tiny_model(family, 4, seed=3)
    pruned = copy.deepcopy(base)
    prune(adapter_for(pruned), [(1, 3)], {(1, 3): random_transform(32, 1)})
    row = compare_speed({"unpruned": base, "pruned": pruned}, SpeedConfig(**{**SMALL, "rounds": 1})).row()
    assert row["param_count_ratio"] < 1 and row["peak_infer_work_gb"] < row["peak_infer_work_gb_baseline"]


def test_bad_input_is_refused_before_any_run():
    a, b = tiny_model("llama", 2), tiny_model("llama", 2, vocab=64)
    with pytest.raises(ValueError, match="vocabularies differ"):
        compare_speed({"a": a, "b": b}, SpeedConfig(**SMALL))
    with pytest.raises(ValueError, match="at least two models"):
        compare_speed({"a": a}, SpeedConfig(**SMALL))
    with pytest.raises(ConfigError, match=r"^eval\.speed\.prompt_len=125: with eval\.speed\.gen_len=8 exceeds"):
        compare_speed({"a": a, "b": copy.deepcopy(a)}, SpeedConfig(prompt_len=125))
