"""LLM-Streamline (objective=streamline_ffn / streamline_layer, experiment=llm_streamline /
llm_streamline_layer): the cut's hidden states as the model computes them, the block run alone as
inside the model, the official learning-rate schedule, training that lowers the loss, and the pruned
models: the FFN variant equals a hand-built model with the FFN written out, the layer variant is a
plain checkpoint with the trained block, and the export builds what save_model=full saves."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from helpers.jobs import job_config
from helpers.models import tiny_model

from replaceme_exp.data.batching import TokenBatch
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.streamline import (
    MIN_TRAINED_STEPS,
    BlockRunner,
    SequenceStore,
    StreamlineEstimator,
    capture_cut_states,
    init_std,
    padded,
    streamline_lr_factor,
    train,
    untrained,
)
from replaceme_exp.models import adapter_for
from replaceme_exp.models.replacement import ReplacementFFN
from replaceme_exp.pipeline import JobSpec


def padded_batch(lengths: list[int], seq: int, side: str = "right", seed: int = 0) -> TokenBatch:
    """Random ids, ``lengths`` real tokens per row, padded to ``seq`` on ``side``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (len(lengths), seq), generator=generator)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        if side == "right":
            mask[i, :n] = 1
        else:
            mask[i, seq - n :] = 1
    return TokenBatch(ids * mask, mask)


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_cut_states_are_the_models_hidden_states_at_the_real_tokens(side):
    model = tiny_model(num_layers=6, seed=3).eval()
    adapter = adapter_for(model)
    batch = padded_batch([9, 5, 12], 12, side)
    store = SequenceStore()
    capture_cut_states(adapter, [batch], (2, 5), store)
    assert len(store) == 3 and store.n_tokens == 26
    for i in range(3):  # each sequence alone, unpadded: the reference
        real = batch.input_ids[i][batch.attention_mask[i].bool()][None]
        with torch.no_grad():
            hidden = model(real, output_hidden_states=True).hidden_states  # [embeddings, L_0, L_1, ...]
        x, y, positions = store.get(i)
        torch.testing.assert_close(x, hidden[2][0], rtol=1e-4, atol=1e-5)  # L_1: input of block 2
        torch.testing.assert_close(y, hidden[5][0], rtol=1e-4, atol=1e-5)  # L_4: output of block 4
        assert positions.tolist() == list(range(real.shape[1]))


GEMMA3_LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


@pytest.mark.parametrize(
    "family, block",
    [("llama", 2), ("gemma3_text", 2), ("gemma3_text", 3)],
    ids=["llama", "gemma3-sliding", "gemma3-global"],
)
def test_a_block_run_alone_on_padded_sequences_gives_its_output_inside_the_model(family, block):
    """Gemma 3: its local block (a sliding window of 4 tokens, shorter than the sequences) and its
    global block, each with its own rotary embedding."""
    extra = {"layer_types": GEMMA3_LAYERS} if family == "gemma3_text" else {}
    model = tiny_model(family, num_layers=4, seed=5, **extra).eval()
    adapter = adapter_for(model)
    store = SequenceStore()
    batch = padded_batch([7, 11, 3], 11, "left", seed=1)
    capture_cut_states(adapter, [batch], (block, block + 1), store)  # the block alone
    x, y, positions, mask = padded([store.get(i) for i in range(3)], adapter.hidden_size)
    with torch.no_grad():
        out = BlockRunner(adapter, adapter.layers[block])(x, positions, mask)
    real = mask.bool()
    torch.testing.assert_close(out[real], y[real], rtol=1e-4, atol=1e-5)


def test_the_schedule_is_the_official_lambda():
    # the official code's numbers: lr 2e-4 -> 5e-5 over 100 steps after 1 of warm-up
    assert streamline_lr_factor(0, 1.0, 100.0, 2e-4, 5e-5) == 0.0
    assert streamline_lr_factor(1, 1.0, 100.0, 2e-4, 5e-5) == pytest.approx(1.0)
    middle = (5e-5 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 1.5e-4) / 2e-4
    assert streamline_lr_factor(50.5, 1.0, 100.0, 2e-4, 5e-5) == pytest.approx(middle)
    assert streamline_lr_factor(100, 1.0, 100.0, 2e-4, 5e-5) == pytest.approx(5e-5 / 2e-4)
    # past the schedule's length the cosine turns back up (not clipped, as in the official code)
    assert streamline_lr_factor(150, 1.0, 100.0, 2e-4, 5e-5) > streamline_lr_factor(100, 1.0, 100.0, 2e-4, 5e-5)


def settings(**changes):
    base = dict(
        lr=3e-3, min_lr=3e-4, weight_decay=1e-3, betas=[0.9, 0.999], batch_size=4, grad_accumulation=2,
        epochs=16, schedule_ratio=1.0, warmup_ratio=0.0, scheduler_steps="optimizer_step", max_grad_norm=5.0,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **changes})


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ffn", "layer"])
def test_training_lowers_the_mse_of_the_replacement(variant):
    model = tiny_model(num_layers=6, seed=2).eval()
    adapter = adapter_for(model)
    batches = [padded_batch([12, 9, 12, 7], 12, seed=s) for s in range(4)]
    store = SequenceStore()
    capture_cut_states(adapter, batches, (2, 5), store)
    torch.manual_seed(0)
    if variant == "ffn":
        network = ReplacementFFN(adapter.hidden_size)

        def forward(x, positions, mask):
            return network(x)
    else:
        network = copy.deepcopy(adapter.layers[2]).requires_grad_(True)
        forward = BlockRunner(adapter, network)
    with torch.enable_grad():
        run = train(network, forward, store, settings(), 0, adapter.hidden_size, torch.device("cpu"))
    assert run.steps == 16 * 2 and len(run.loss_curve) == run.steps and run.micro_batches == 4
    # the learning rate of each optimizer step: the official schedule, stepped once per step, by hand
    hand = [3e-3 * streamline_lr_factor(k, 0.0, 4 * 16, 3e-3, 3e-4) for k in range(run.steps)]
    assert run.lr_curve == pytest.approx(hand) and not untrained(run)
    assert run.loss_after < 0.7 * run.loss_before and run.loss_curve[-1] < run.loss_curve[0]
    # loss_after is the MSE over every token, computed again here by hand
    x, y, positions, mask = padded([store.get(i) for i in range(len(store))], adapter.hidden_size)
    with torch.no_grad():
        error = ((forward(x, positions, mask) - y) ** 2).sum(-1)[mask.bool()]
    assert run.loss_after == pytest.approx(float(error.sum()) / (int(mask.sum()) * adapter.hidden_size), rel=1e-5)


def test_a_handful_of_steps_or_steps_at_learning_rate_zero_leave_the_network_untrained():
    model = tiny_model(num_layers=6, seed=2).eval()
    adapter = adapter_for(model)
    store = SequenceStore()
    capture_cut_states(adapter, [padded_batch([12, 9, 12, 7], 12, seed=s) for s in range(4)], (2, 5), store)

    def trained(**changes):
        network = ReplacementFFN(adapter.hidden_size)
        with torch.enable_grad():
            return train(network, lambda x, p, m: network(x), store, settings(**changes), 0, 32, torch.device("cpu"))

    # the layer preset's schedule on a calibration set: one step, at the warm-up's learning rate 0
    one = trained(epochs=1, batch_size=8, grad_accumulation=16, schedule_ratio=0.5, warmup_ratio=0.01)
    assert (one.steps, one.lr_curve) == (1, [0.0]) and untrained(one)
    few = trained(epochs=2, warmup_ratio=0.0)  # 2 x 2 steps at lr > 0: a handful
    assert few.steps == 4 < MIN_TRAINED_STEPS and min(few.lr_curve) > 0 and untrained(few)
    enough = trained(epochs=MIN_TRAINED_STEPS // 2, warmup_ratio=0.0)
    assert enough.steps == MIN_TRAINED_STEPS and not untrained(enough)


def test_the_ffn_is_initialised_as_the_authors_model_class_does(monkeypatch):
    """Weights from N(0, the model's initializer_range), zero biases (LlamaPreTrainedModel._init_weights,
    which post_init runs over the authors' MLP), checked on the FFN the estimator builds before it
    trains; ``ffn_init=pytorch`` keeps nn.Linear's default (uniform within 1 / sqrt(fan_in))."""
    import replaceme_exp.estimation.streamline as streamline

    model = tiny_model(num_layers=6, seed=2, initializer_range=0.05).eval()
    built = {}

    def record_then_train(network, *args, **kwargs):
        built[len(built)] = {n: p.detach().clone() for n, p in network.named_parameters()}
        return train(network, *args, **kwargs)

    monkeypatch.setattr(streamline, "train", record_then_train)
    batches = [padded_batch([12, 9, 12, 7], 12, seed=s) for s in range(2)]
    objective = vars(settings(epochs=1))
    for init in ("normal", "pytorch"):
        estimator = StreamlineEstimator("streamline_ffn", "ffn", ffn_expansion=4, ffn_init=init, **objective)
        replacement = estimator.replace(adapter_for(model), batches, (2, 5), seed=0)
        expected = 0.05 if init == "normal" else None
        assert replacement.columns["replacement_init_std"] == expected
    normal, default = built[0], built[1]
    for name in ("fc1.weight", "fc2.weight"):
        w = normal[name]
        assert w.numel() == 4 * 32 * 32 and abs(float(w.std()) / 0.05 - 1) < 0.05 and abs(float(w.mean())) < 0.003
        fan_in = w.shape[1]
        assert float(default[name].abs().max()) <= 1 / math.sqrt(fan_in)  # PyTorch's Kaiming-uniform bound
    assert not normal["fc1.bias"].any() and not normal["fc2.bias"].any()
    assert default["fc1.bias"].abs().sum() > 0
    assert init_std(adapter_for(tiny_model(num_layers=2)), "normal") == 0.02  # the family's default range


def test_the_scaled_preset_takes_the_authors_optimizer_steps_on_128_sequences(tmp_path):
    """The authors' FFN recipe takes 300,000 sequences in one epoch at 32 per micro-batch and 2 per step;
    experiment=llm_streamline_scaled keeps everything but the batch (1 sequence per step) and the
    epochs (enough for as many optimizer steps on 128 sequences)."""
    authors_steps = math.ceil(math.ceil(300_000 / 32) / 2)
    scaled = JobSpec.from_config(job_config(tmp_path, "experiment=llm_streamline_scaled")).config.objective
    paper = JobSpec.from_config(job_config(tmp_path, "experiment=llm_streamline")).config.objective
    assert (paper.batch_size, paper.grad_accumulation, paper.epochs) == (32, 2, 1)
    assert (scaled.batch_size, scaled.grad_accumulation, scaled.epochs) == (1, 1, math.ceil(authors_steps / 128))
    assert 128 * scaled.epochs >= authors_steps > 128 * (scaled.epochs - 1)
    kept = ("replacement", "ffn_expansion", "ffn_init", "lr", "min_lr", "weight_decay", "betas", "warmup_ratio")
    kept += ("schedule_ratio", "scheduler_steps", "max_grad_norm")
    assert all(getattr(scaled, k) == getattr(paper, k) for k in kept) and paper.ffn_init == "normal"


def test_the_store_on_disk_gives_back_what_it_was_given(tmp_path):
    store = SequenceStore("disk", str(tmp_path))
    x, y, p = torch.randn(5, 8), torch.randn(5, 8), torch.arange(5)
    store.put(x, y, p)
    got = store.get(0)
    assert all(torch.equal(a, b) for a, b in zip(got, (x, y, p))) and any(tmp_path.iterdir())
    store.close()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("num_lts=2", "num_lts"),
        ("model.capture_4bit=true", "model.capture_4bit"),
        ("mask_ratio=0.2", "mask_ratio"),
        ("cuts=[[1,3],[4,5]]", "cuts"),
        ("objective.betas=[0.9]", "objective.betas"),
    ],
)
def test_what_cannot_act_is_refused_in_one_line(tmp_path, override, key):
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(job_config(tmp_path, "experiment=llm_streamline", override))
    assert err.value.key == key


def test_the_variants_name_their_method_and_settings_and_leave_other_hashes_alone(tmp_path):
    ffn = JobSpec.from_config(job_config(tmp_path, "experiment=llm_streamline"))
    layer = JobSpec.from_config(job_config(tmp_path, "experiment=llm_streamline_layer"))
    assert ffn.setting_columns()["method"] == "LLM-Streamline (FFN)"
    assert layer.setting_columns()["method"] == "LLM-Streamline (layer)"
    assert ffn.setting_columns()["plain_checkpoint"] is False and layer.setting_columns()["plain_checkpoint"] is True
    assert ffn.setting_columns()["replacement_settings"]["ffn_expansion"] == 4
    assert "ffn_expansion" not in layer.identity()["objective"]  # no FFN is built: out of the hash
    wider = JobSpec.from_config(job_config(tmp_path, "experiment=llm_streamline_layer", "objective.ffn_expansion=8"))
    assert wider.config_hash == layer.config_hash
    assert layer.selection_request().extra_blocks == 1 and ffn.selection_request().extra_blocks == 0
