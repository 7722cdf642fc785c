"""CLIP's vision encoder (random weights: no CLIP checkpoint is available offline): capture
against activations computed module by module, the pruned encoder against a hand-built one with
the blocks bypassed and T applied explicitly, save / reload, layer-wise capture."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.clip import CLIP_JOB, image_calibration, images, tiny_processor
from helpers.explicit_modules import Bypass, TransformedMLP, random_transform
from transformers import CLIPConfig, CLIPModel, CLIPVisionConfig, CLIPVisionModel

from replaceme_exp.capture import LinearStatistics, run_capture
from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.data.batching import ImageBatch, TokenBatches
from replaceme_exp.estimation import ridge_solve
from replaceme_exp.models import adapter_for
from replaceme_exp.surgery import prune


VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4, image_size=32, patch_size=8
)


POSITIONS = (32 // 8) ** 2 + 1  # 16 patches and the class token


CUTS = [(2, 4), (5, 7)]


def tiny_clip(seed: int = 0) -> CLIPModel:
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=64)
    config = CLIPConfig(
        text_config={**text, "max_position_embeddings": 16, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1},
        vision_config=VISION,
        projection_dim=16,
    )
    torch.manual_seed(seed)
    model = CLIPModel(config).eval().requires_grad_(False)
    with torch.no_grad():  # larger weights than the default init, so blocks visibly change the stream
        for name, p in model.vision_model.encoder.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model


def image_batches(pixels: torch.Tensor, batch_size: int) -> TokenBatches:
    chunks = pixels.split(batch_size)
    return TokenBatches([ImageBatch(c, torch.ones(len(c), POSITIONS, dtype=torch.long)) for c in chunks], POSITIONS)


def module_by_module(model: CLIPModel, pixels: torch.Tensor, cut) -> tuple[torch.Tensor, torch.Tensor]:
    """(M_{start-1}, L_{end-1} - Y_{start-1}) over every image position, (n * positions, hidden),
    from the encoder's hidden states and block ``start-1``'s attention and MLP called directly."""
    start, end = cut
    vision = model.vision_model
    hidden = vision(pixel_values=pixels, output_hidden_states=True).hidden_states  # hidden[k] = input of block k
    block = vision.encoder.layers[start - 1]
    x = hidden[start - 1]
    y = x + block.self_attn(block.layer_norm1(x))[0]
    m = block.mlp(block.layer_norm2(y))
    return m.reshape(-1, m.shape[-1]), (hidden[end] - y).reshape(-1, m.shape[-1])


def test_clip_statistics_give_the_lstsq_transform_of_activations_computed_module_by_module():
    model, pixels = tiny_clip(), images(6, 1)
    adapter = adapter_for(model)
    assert adapter.num_layers == 8 and adapter.hidden_size == 32
    statistics = LinearStatistics(CUTS, 32, torch.device("cpu"))
    run_capture(adapter, image_batches(pixels, 4), [statistics])
    for cut in CUTS:
        m, r = (t.double() for t in module_by_module(model, pixels, cut))
        stats = statistics.result()[cut]
        assert stats.n_tokens == 6 * POSITIONS
        torch.testing.assert_close(stats.mtm, m.T @ m, rtol=1e-4, atol=1e-4)
        expected = torch.linalg.lstsq(m, r).solution
        torch.testing.assert_close(ridge_solve(stats, 0.0), expected, rtol=1e-4, atol=1e-5)


def test_pruned_clip_embeds_images_as_the_hand_built_encoder_and_reloads(tmp_path):
    model, pixels = tiny_clip(seed=2), images(5, 3)
    transforms = {cut: random_transform(32, i) for i, cut in enumerate(CUTS)}
    reference = copy.deepcopy(model)
    layers = reference.vision_model.encoder.layers
    for start, end in CUTS:
        layers[start - 1].mlp = TransformedMLP(layers[start - 1].mlp, transforms[(start, end)])
        for i in range(start, end):
            layers[i] = Bypass()
    expected = adapter_for(reference).image_embeddings(pixels)
    adapter = adapter_for(model)
    kept = prune(adapter, CUTS, transforms)
    assert kept == [0, 1, 4, 7] and model.config.vision_config.num_hidden_layers == 4
    assert model.config.text_config.num_hidden_layers == 2  # the text tower is untouched
    assert model.vision_model.encoder.layers[1].mlp.fc2.bias is not None  # the bias took T^T b
    torch.testing.assert_close(adapter.image_embeddings(pixels), expected, rtol=1e-4, atol=1e-5)
    model.save_pretrained(tmp_path / "pruned")
    reloaded = CLIPModel.from_pretrained(tmp_path / "pruned").eval()
    assert len(reloaded.vision_model.encoder.layers) == 4
    torch.testing.assert_close(adapter_for(reloaded).image_embeddings(pixels), expected, rtol=1e-4, atol=1e-5)


def test_a_bare_vision_model_is_adapted_too():
    torch.manual_seed(0)
    model = CLIPVisionModel(CLIPVisionConfig(**VISION)).eval()
    adapter = adapter_for(model)
    assert adapter.num_layers == 8 and adapter.image_embeddings(images(2, 0)).shape == (2, 32)
    prune(adapter, [(2, 4)], {(2, 4): torch.eye(32)})
    assert model.config.num_hidden_layers == 6


@pytest.mark.parametrize("location", ["gpu", "disk"])
def test_layerwise_capture_of_clip_equals_the_whole_model_capture(location):
    adapter, batches = adapter_for(tiny_clip(seed=4)), image_batches(images(7, 5), 3)
    whole = LinearStatistics(CUTS, 32, torch.device("cpu"))
    run_capture(adapter, batches, [whole])
    execution = CaptureExecution(mode="layerwise", device=torch.device("cpu"), store=location)
    layerwise = LinearStatistics(CUTS, 32, torch.device("cpu"))
    run_capture(adapter, batches, [layerwise], execution=execution)
    for cut in CUTS:
        assert torch.equal(whole.result()[cut].mtm, layerwise.result()[cut].mtm)
        assert torch.equal(whole.result()[cut].mtr, layerwise.result()[cut].mtr)


def test_image_calibration_is_processed_augmented_to_n_samples_cached_and_captured(tmp_path):
    batches = image_calibration(tmp_path)
    assert [b.pixel_values.shape[0] for b in batches] == [16, 16, 8] and batches.seq_len == POSITIONS
    assert batches.batches[0].pixel_values.shape[1:] == (3, 32, 32) and batches.n_tokens == 40 * POSITIONS
    assert len(list((tmp_path / "cache" / "images").glob("*.pt"))) == 1
    again = image_calibration(tmp_path)  # from the cache
    assert again.content_hash() == batches.content_hash()
    reseeded = image_calibration(tmp_path, seed=1)
    first, other = (torch.cat([b.pixel_values for b in x.batches]) for x in (batches, reseeded))
    assert torch.equal(first[:28], other[:28]) and not torch.equal(first[28:], other[28:])  # only the crops move
    statistics = LinearStatistics(CUTS, 32, torch.device("cpu"))
    run_capture(adapter_for(tiny_clip()), batches, [statistics])
    assert statistics.result()[CUTS[0]].n_tokens == 40 * POSITIONS


def text_clip(seed: int = 0) -> CLIPModel:
    """A random CLIP whose text tower reads SmolLM2's tokenizer (the only tokenizer offline)."""
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=49152)
    ids = dict(max_position_embeddings=16, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    config = CLIPConfig(text_config={**text, **ids}, vision_config=VISION, projection_dim=16)
    return CLIPModel(config).eval().requires_grad_(False)


def test_zero_shot_classification_and_retrieval_equal_a_direct_computation(smollm2_tokenizer):
    import torch.nn.functional as F

    from replaceme_exp.evaluation.clip_benchmarks import (
        BUNDLED_TEMPLATES,
        ClipForBenchmark,
        TextTokenizer,
        bundled_dataset,
        evaluate_benchmark,
    )

    model, processor, cpu = text_clip(), tiny_processor(), torch.device("cpu")
    adapter = adapter_for(model)
    text = TextTokenizer(smollm2_tokenizer, 16)
    objects = bundled_dataset("bundled_objects", processor)
    assert len(objects) == 12 and "cat" in objects.classes
    # The zero-shot classifier by hand: per class, the renormalised mean of its prompts' unit embeddings.
    with torch.no_grad():
        weights = []
        for name in objects.classes:
            prompts = text([t.format(c=name) for t in BUNDLED_TEMPLATES])
            unit = F.normalize(model.text_projection(model.text_model(input_ids=prompts).pooler_output), dim=-1)
            weights.append(F.normalize(unit.mean(0), dim=0))
        logits = 100 * F.normalize(adapter.image_embeddings(objects.pixels), dim=-1) @ torch.stack(weights, 1)
    top5 = logits.topk(5, dim=1).indices
    expected_acc1 = float((logits.argmax(1) == objects.targets).float().mean())
    expected_acc5 = float((top5 == objects.targets[:, None]).any(1).float().mean())
    metrics = evaluate_benchmark(model, adapter, smollm2_tokenizer, processor, "bundled_objects", 5, cpu)
    assert metrics["acc1"] == pytest.approx(expected_acc1) and metrics["acc5"] == pytest.approx(expected_acc5)
    # Retrieval: one caption per image, recall@5 = the true partner among the 5 most similar.
    captions = bundled_dataset("bundled_captions", processor)
    with torch.no_grad():
        wrapped = ClipForBenchmark(model, adapter)
        images = F.normalize(wrapped.encode_image(captions.pixels), dim=-1)
        texts = F.normalize(wrapped.encode_text(text([c[0] for c in captions.targets])), dim=-1)
        scores = images @ texts.T
    diagonal = torch.arange(len(captions))
    image_recall = float((scores.T.topk(5, dim=1).indices == diagonal[:, None]).any(1).float().mean())
    text_recall = float((scores.topk(5, dim=1).indices == diagonal[:, None]).any(1).float().mean())
    metrics = evaluate_benchmark(model, adapter, smollm2_tokenizer, processor, "bundled_captions", 5, cpu)
    assert metrics["image_retrieval_recall@5"] == pytest.approx(image_recall)
    assert metrics["text_retrieval_recall@5"] == pytest.approx(text_recall)


@pytest.mark.slow
def test_a_clip_job_prunes_the_vision_encoder_and_records_what_the_saved_model_scores(tmp_path, smollm2_tokenizer):
    from helpers.config import compose_config

    from replaceme_exp.evaluation.clip_benchmarks import evaluate_benchmark
    from replaceme_exp.runtime import run_recorded

    row = run_recorded(
        compose_config([*CLIP_JOB, f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", "save_model=full"])
    )
    assert row["status"] == "finished" and row["num_layers"] == 8 and row["n_prune"] == 2
    assert row["vision_compression_ratio"] == 0.25 and row["calib_seq_len"] == POSITIONS
    assert row["n_calib_tokens"] == 48 * POSITIONS and len(row["candidate_distances"]) == 6
    assert 0 <= row["cos_dist_after"] < row["cos_dist_before"]  # LS brings block `end` its input closer
    reloaded = CLIPModel.from_pretrained(row["pruned_model_path"]).eval()
    assert len(reloaded.vision_model.encoder.layers) == 6
    from transformers import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil.from_pretrained(row["pruned_model_path"])
    cpu = torch.device("cpu")
    adapter = adapter_for(reloaded)
    objects = evaluate_benchmark(reloaded, adapter, smollm2_tokenizer, processor, "bundled_objects", 16, cpu)
    captions = evaluate_benchmark(reloaded, adapter, smollm2_tokenizer, processor, "bundled_captions", 16, cpu)
    assert row["acc1_bundled_objects"] == pytest.approx(objects["acc1"])
    assert row["acc5_bundled_objects"] == pytest.approx(objects["acc5"])
    assert row["text_recall5_bundled_captions"] == pytest.approx(captions["text_retrieval_recall@5"])
    assert row["vision_recall5_bundled_captions"] == pytest.approx(captions["image_retrieval_recall@5"])
    assert row["baseline_acc5_bundled_objects"] is not None


@pytest.mark.slow
def test_the_clip_template_fills_the_papers_clip_table_from_tiny_clip_runs(tmp_path, capsys):
    """The four jobs of ``+paper=clip`` (LS and UIDL at 1 and 2 of 8 blocks: the paper's 13% and
    25%) on the random CLIP, then the CLIP table retargeted to them (``eval=clip_offline``: the
    bundled-image benchmarks stand in for MS-COCO and CIFAR-10)."""
    from helpers.config import compose_config

    from replaceme_exp.reporting.render_paper import main as render_paper
    from replaceme_exp.runtime import run_recorded

    common = ["+paper=clip", *CLIP_JOB, f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats"]
    rows = {}
    for n_prune in (1, 2):
        for experiment in ("replaceme_ls", "uidl_baseline"):
            cfg = compose_config([*common, f"n_prune={n_prune}", f"experiment={experiment}", "save_model=false"])
            assert cfg.estimation.tokens == "all" and cfg.eval.name == "clip_offline"
            rows[n_prune, experiment] = run_recorded(cfg)
    render_paper(["--results", str(tmp_path), "--out", str(tmp_path / "tables"), "--model", "tiny_clip"])
    out = capsys.readouterr().out
    assert "clip: 4 runs found (model=tiny_clip, eval=clip_offline), 4 matched a cell, 4 shown" in out
    table = (tmp_path / "tables" / "tiny_clip_bundled_images_clip_offline" / "clip.md").read_text()
    assert "12.5% = 1 of 8 blocks, 25% = 2 of 8 blocks" in table
    lines = {line.split("|")[1].strip() + line.split("|")[2].strip(): line for line in table.splitlines()[4:9]}
    ls_25 = lines["ReplaceMe (LS)25%"].split("|")
    assert float(ls_25[6]) == pytest.approx(rows[2, "replaceme_ls"]["acc1_bundled_objects"], abs=1e-4)
    assert float(ls_25[4]) == pytest.approx(rows[2, "replaceme_ls"]["text_recall5_bundled_captions"], abs=1e-4)
    baseline = lines["CLIP-L/14-"].split("|")
    assert float(baseline[7]) == pytest.approx(rows[1, "replaceme_ls"]["baseline_acc5_bundled_objects"], abs=1e-4)
    from replaceme_exp.reporting.report import write_report

    write_report(str(tmp_path), None)
    runs_table = (tmp_path / "report" / "all.md").read_text()
    assert "vision_compression_ratio" in runs_table and "acc1_bundled_objects" in runs_table
