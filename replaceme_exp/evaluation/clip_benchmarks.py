"""Zero-shot CLIP benchmarks with clip-benchmark's metrics on the in-memory (pruned) model.

clip-benchmark (LAION's CLIP_benchmark) computes the paper's CLIP metrics: zero-shot
classification (acc1, acc5, mean per-class recall; mean average precision for multi-label
VOC2007) and image-text retrieval (recall@k). Its metric functions take any model with
``encode_image`` / ``encode_text``, a tokenizer and a dataloader; :class:`ClipForBenchmark` wraps
a transformers CLIP model so they run on the model this job pruned, without saving it.

Benchmarks (``eval.benchmarks``):

- the paper's five, read from the hub's ``clip-benchmark/wds_<name>`` webdataset repositories
  (image ``webp``/``jpg``/``png``, label ``cls`` or multi-hot ``npy``, captions ``txt``; class names
  and prompt templates from the repository's ``classnames.txt`` and
  ``zeroshot_classification_templates.txt``), as clip-benchmark's own ``wds/<name>`` datasets;
- ``bundled_objects`` / ``bundled_captions``: an offline smoke classification and retrieval set of
  real images shipped in scikit-image and scikit-learn (:mod:`replaceme_exp.data.images`), with
  a few class names and captions written for them here.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from replaceme_exp.data.hub import HubDataset
from replaceme_exp.data.images import bundled_images
from replaceme_exp.errors import ConfigError

log = logging.getLogger(__name__)

# The paper's CLIP table: benchmark -> (hub repository, task, metrics it reports)
HUB_BENCHMARKS = {
    "cifar10": ("clip-benchmark/wds_cifar10", "zeroshot_classification"),
    "voc2007_multilabel": ("clip-benchmark/wds_voc2007_multilabel", "zeroshot_classification"),
    "vtab/eurosat": ("clip-benchmark/wds_vtab-eurosat", "zeroshot_classification"),
    "mscoco_captions": ("clip-benchmark/wds_mscoco_captions", "zeroshot_retrieval"),
}
# Offline: real bundled images, the class each shows, and a caption for retrieval.
BUNDLED_OBJECTS = {
    "astronaut": ("astronaut", "a portrait of an astronaut in a spacesuit"),
    "chelsea": ("cat", "a close-up photo of a tabby cat"),
    "coffee": ("cup of coffee", "a cup of coffee on a saucer"),
    "rocket": ("rocket", "a rocket on its launch pad"),
    "motorcycle_left": ("motorcycle", "a motorcycle parked indoors"),
    "moon": ("moon", "a black and white photo of the moon's surface"),
    "coins": ("coins", "old coins on a dark background"),
    "horse": ("horse", "a black silhouette of a horse"),
    "china": ("temple", "a chinese temple behind trees"),
    "flower": ("flower", "a close-up photo of a flower"),
    "page": ("page of text", "a scanned page of printed text"),
    "hubble_deep_field": ("galaxies", "a telescope image of distant galaxies"),
}
BUNDLED_TEMPLATES = ["a photo of a {c}.", "a picture of a {c}.", "an image of a {c}."]
# Bump when the benchmarks' data or metrics change here (cached unpruned scores are keyed by it).
BENCHMARKS_VERSION = 1
# What the scores also depend on: the metrics, and the bundled images' packages.
LIBRARIES = ("clip-benchmark", "scikit-image", "scikit-learn")
BUNDLED = ("bundled_objects", "bundled_captions")
# A classification benchmark's repository files: its class names and its prompt templates.
CLASSIFICATION_FILES = ("classnames.txt", "zeroshot_classification_templates.txt")


def benchmark_task(name: str) -> str:
    if name in HUB_BENCHMARKS:
        return HUB_BENCHMARKS[name][1]
    if name in BUNDLED:
        return "zeroshot_classification" if name == "bundled_objects" else "zeroshot_retrieval"
    raise ConfigError("eval.benchmarks", name, f"choose among {sorted(HUB_BENCHMARKS) + list(BUNDLED)}")


def benchmark_datasets(names: list[str]) -> list[HubDataset]:
    """The hub datasets (and the repository files a classification benchmark reads its class names
    and prompts from) of the benchmarks ``names``; the bundled ones need none."""
    instead = "evaluate on the bundled images (eval=clip_offline)"
    out = []
    for name in names:
        if name in HUB_BENCHMARKS:
            repo, task = HUB_BENCHMARKS[name]
            files = CLASSIFICATION_FILES if task == "zeroshot_classification" else ()
            out.append(HubDataset("eval.benchmarks", name, repo, repo_files=files, instead=instead))
    return out


class ClipForBenchmark(nn.Module):
    """A transformers ``CLIPModel`` as clip-benchmark expects it: ``encode_image(pixels)`` and
    ``encode_text(token_ids)`` return the (unnormalised) projected embeddings, (batch, dim)."""

    def __init__(self, model, adapter):
        super().__init__()
        self.model, self.adapter = model, adapter

    def encode_image(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.adapter.image_embeddings(pixel_values)

    def encode_text(self, input_ids: torch.Tensor) -> torch.Tensor:
        # No padding mask, as OpenAI's CLIP: the causal mask keeps the pooled end-of-text token
        # from seeing the padding after it.
        pooled = self.model.text_model(input_ids=input_ids).pooler_output
        return self.model.text_projection(pooled)


class TextTokenizer:
    """clip-benchmark's tokenizer call: a list of strings -> (n, context) token ids, padded to
    the text tower's context length (77 for CLIP) and truncated to it."""

    def __init__(self, tokenizer, context_length: int):
        self.tokenizer, self.context_length = tokenizer, context_length

    def __call__(self, texts: list[str]) -> torch.Tensor:
        encoded = self.tokenizer(
            list(texts), padding="max_length", truncation=True, max_length=self.context_length, return_tensors="pt"
        )
        return encoded["input_ids"]


class ImageDataset(torch.utils.data.Dataset):
    """``(pixels, target)`` pairs: ``target`` a class index, a multi-hot vector, or a list of
    captions (retrieval); ``classes`` and ``templates`` as clip-benchmark reads them."""

    def __init__(self, pixels: torch.Tensor, targets: list, classes=None, templates=None):
        self.pixels, self.targets, self.classes, self.templates = pixels, targets, classes, templates

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        return self.pixels[i], self.targets[i]


def _collate_retrieval(batch):
    return torch.stack([pixels for pixels, _ in batch]), [captions for _, captions in batch]


def bundled_dataset(name: str, processor) -> ImageDataset:
    images = bundled_images()
    names = [n for n in BUNDLED_OBJECTS if n in images]
    pixels = processor(images=[images[n] for n in names], return_tensors="pt")["pixel_values"]
    if name == "bundled_objects":
        classes = sorted({BUNDLED_OBJECTS[n][0] for n in names})
        targets = [classes.index(BUNDLED_OBJECTS[n][0]) for n in names]
        return ImageDataset(pixels, torch.tensor(targets), classes, BUNDLED_TEMPLATES)
    return ImageDataset(pixels, [[BUNDLED_OBJECTS[n][1]] for n in names])


def hub_dataset(name: str, processor, limit: int | None) -> ImageDataset:
    """The ``test`` split of the benchmark's clip-benchmark webdataset repository on the hub."""
    from datasets import load_dataset
    from huggingface_hub import hf_hub_download

    repo, task = HUB_BENCHMARKS[name]
    try:
        records = load_dataset(repo, split="test", streaming=True)
    except Exception as err:  # noqa: BLE001 - offline, no such repository
        raise ConfigError("eval.benchmarks", name, f"{repo} cannot be loaded ({err})") from err
    images, targets = [], []
    for i, record in enumerate(records):
        if limit is not None and i >= limit:
            break
        image = next(record[k] for k in ("webp", "jpg", "png", "jpeg") if k in record)
        images.append(image.convert("RGB"))
        if task == "zeroshot_retrieval":
            targets.append(record["txt"].split("\n"))
        else:
            targets.append(torch.as_tensor(record["npy"]) if "npy" in record else int(record["cls"]))
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    if task == "zeroshot_retrieval":
        return ImageDataset(pixels, targets)

    def lines(filename: str) -> list[str]:
        path = hf_hub_download(repo, filename, repo_type="dataset")
        return [line.strip() for line in open(path, encoding="utf-8") if line.strip()]

    labels = torch.stack(targets) if isinstance(targets[0], torch.Tensor) else torch.tensor(targets)
    return ImageDataset(pixels, labels, *(lines(file) for file in CLASSIFICATION_FILES))


def evaluate_benchmark(
    model, adapter, tokenizer, processor, name: str, batch_size: int, device: torch.device, limit=None, amp=False
) -> dict[str, float]:
    """clip-benchmark's metrics of ``name`` on the in-memory model. Returns, by metric name:
    classification ``acc1``, ``acc5``, ``mean_per_class_recall`` (``mean_average_precision`` for
    multi-label data); retrieval ``image_retrieval_recall@5`` and ``text_retrieval_recall@5``."""
    from clip_benchmark.metrics import zeroshot_classification, zeroshot_retrieval

    task = benchmark_task(name)
    dataset = bundled_dataset(name, processor) if name in BUNDLED else hub_dataset(name, processor, limit)
    wrapped = ClipForBenchmark(model, adapter)
    text = TextTokenizer(tokenizer, int(model.config.text_config.max_position_embeddings))
    collate = _collate_retrieval if task == "zeroshot_retrieval" else None
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
    with torch.inference_mode():
        if task == "zeroshot_retrieval":
            metrics = zeroshot_retrieval.evaluate(wrapped, loader, text, device.type, amp=amp, recall_k_list=[5])
        else:
            classifier = zeroshot_classification.zero_shot_classifier(
                wrapped, text, dataset.classes, dataset.templates, device.type, amp=amp
            )
            logits, target = zeroshot_classification.run_classification(
                wrapped, classifier, loader, device.type, amp=amp
            )
            metrics = classification_metrics(logits, target)
    out = {key: float(value) for key, value in metrics.items()}
    log.info("%s: %s", name, {k: round(v, 4) for k, v in out.items() if not math.isnan(v)})
    return out


def classification_metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """clip-benchmark's classification metrics of (n, classes) logits: multi-label (n, classes)
    targets give ``mean_average_precision`` (its ``average_precision_per_class``); class indices
    (n,) give ``acc1``, ``acc5`` (NaN under 5 classes) and ``mean_per_class_recall``. Its own
    ``evaluate`` is not called because its top-k accuracy converts a 1-element array with
    ``float()``, which the installed NumPy 2.4 refuses; the same formulas are taken here."""
    from clip_benchmark.metrics.zeroshot_classification import average_precision_per_class
    from sklearn.metrics import balanced_accuracy_score

    if target.dim() == 2:
        return {"mean_average_precision": float(average_precision_per_class(logits, target).mean())}
    top = logits.topk(min(5, logits.shape[1]), dim=1).indices
    hits = top == target[:, None]
    return {
        "acc1": float(hits[:, 0].float().mean()),
        "acc5": float(hits.any(1).float().mean()) if logits.shape[1] >= 5 else float("nan"),
        "mean_per_class_recall": float(balanced_accuracy_score(target.numpy(), logits.argmax(1).numpy())),
    }
