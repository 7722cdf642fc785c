"""Image calibration data for vision encoders: real images from a folder, a hub image dataset, or
(offline) the photographs and scans that ship inside scikit-image and scikit-learn, processed by
the model's image processor into :class:`~replaceme_exp.data.batching.ImageBatch` batches and
cached as tensors (each entry carrying its key and a checksum, checked on read).

When a source holds fewer images than ``n_samples``, the rest are seeded random crops (a quarter
to all of the image's area) with random horizontal flips of its images, the usual augmentation of
image pretraining; the number of distinct source images is recorded with the batches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import warnings
from pathlib import Path

import torch

from replaceme_exp.config import schema
from replaceme_exp.data.batching import ImageBatch, TokenBatches
from replaceme_exp.data.calibration import CALIBRATION_SOURCES, calibration_source
from replaceme_exp.data.hub import HubDataset
from replaceme_exp.errors import ConfigError
from replaceme_exp.storage import (
    discard_entry,
    read_keyed_tensors,
    remove_dead_temporaries,
    write_keyed_tensors,
    write_optional,
)

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


@calibration_source("bundled_images", "vision", schema.CalibrationConfig)
def bundled_images(cfg=None) -> dict[str, "Image.Image"]:  # noqa: F821
    """The real images bundled in the installed scikit-image wheel (``skimage/data``: astronaut,
    cat, coffee, coins, moon, motorcycle, rocket, retina, Hubble deep field, ...) and
    scikit-learn's two sample photographs (``china``, ``flower``), as RGB PIL images by name."""
    import numpy as np
    import skimage.data
    from PIL import Image
    from sklearn.datasets import load_sample_images

    folder = Path(skimage.data.__file__).parent
    files = sorted(p for p in folder.glob("*") if p.suffix in (".png", ".jpg"))  # not the test TIFFs
    out = {path.stem: Image.open(path).convert("RGB") for path in files}
    samples = load_sample_images()
    for name, array in zip(samples.filenames, samples.images):
        out[Path(name).stem] = Image.fromarray(np.asarray(array, dtype=np.uint8)).convert("RGB")
    return out


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES


def image_files(key: str, path: str) -> list[Path]:
    """The image files under the folder ``path`` (recursively, sorted); a missing folder or one
    without images is refused naming ``key``."""
    root = Path(str(path)).expanduser()
    if not root.is_dir():
        raise ConfigError(key, path, "no such image folder")
    try:
        files = sorted(p for p in root.rglob("*") if _is_image(p))
    except OSError as err:
        raise ConfigError(key, path, f"cannot be listed ({err.strerror or err})") from err
    if not files:
        raise ConfigError(key, path, f"holds no image file ({', '.join(IMAGE_SUFFIXES)})")
    return files


def opened_image(key: str, folder: str, file: Path) -> "Image.Image":  # noqa: F821
    """``file`` opened by PIL, its header read and its size checked against PIL's limit against
    decompression bombs (``PIL.Image.MAX_IMAGE_PIXELS``); its pixels are not decoded yet. A file PIL
    cannot identify or a bomb is refused naming ``key``, the folder and the file."""
    from PIL import Image

    name = file.relative_to(Path(str(folder)).expanduser())
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is checked below
            image = Image.open(file)
    except Image.DecompressionBombError as err:
        raise ConfigError(key, folder, f"{name}: {err}") from err
    except Exception as err:  # noqa: BLE001 - PIL raises several types for a file it cannot read
        raise ConfigError(key, folder, f"{name} is not an image PIL can read ({err})") from err
    width, height = image.size
    if limit is not None and width * height > limit:
        image.close()
        reason = f"{name} has {width} x {height} pixels, more than PIL's limit of {limit} (a decompression bomb?)"
        raise ConfigError(key, folder, reason)
    return image


def check_image_folder(cfg, key: str, n_samples: int | None = None) -> None:
    """Before the model loads: every image file's header (format and size, no pixels decoded)."""
    for file in image_files(f"{key}.path", cfg.path):
        opened_image(f"{key}.path", cfg.path, file).close()


def read_image(key: str, folder: str, file: Path) -> "Image.Image":  # noqa: F821
    """``file`` decoded as an RGB image (checked as :func:`opened_image` checks it); a file that
    does not decode (truncated, corrupt) is refused naming ``key``, the folder and the file."""
    with opened_image(key, folder, file) as image:
        try:
            return image.convert("RGB")
        except Exception as err:  # noqa: BLE001 - a broken file: PIL raises OSError, SyntaxError, ValueError, ...
            name = file.relative_to(Path(str(folder)).expanduser())
            raise ConfigError(key, folder, f"{name} cannot be decoded ({type(err).__name__}: {err})") from err


def image_folder_exists(cfg, key: str) -> None:
    """``<key>.path`` is a folder."""
    if not Path(str(cfg.path)).expanduser().is_dir():
        raise ConfigError(f"{key}.path", cfg.path, "no such image folder")


@calibration_source(
    "image_folder", "vision", schema.FolderImagesConfig, check=check_image_folder, settings=image_folder_exists
)
def image_folder(cfg) -> dict[str, "Image.Image"]:  # noqa: F821
    """Every image file under ``cfg.path`` (recursively, sorted)."""
    return folder_images(cfg.path)


def folder_images(path: str, key: str = "calibration.path") -> dict[str, "Image.Image"]:  # noqa: F821
    """Every image file under ``path`` (recursively, sorted), as RGB PIL images by relative path."""
    root = Path(str(path)).expanduser()
    return {str(p.relative_to(root)): read_image(key, path, p) for p in image_files(key, path)}


def hub_image_datasets(cfg, key: str) -> list[HubDataset]:
    instead = "calibrate on local images (calibration=image_folder or bundled_images)"
    return [HubDataset(f"{key}.dataset", cfg.dataset, cfg.dataset, cfg.subset, instead=instead)]


def hub_dataset_named(cfg, key: str) -> None:
    """``<key>.dataset`` names a hub image dataset."""
    if not isinstance(cfg.dataset, str) or cfg.dataset in ("", "???"):
        raise ConfigError(f"{key}.dataset", cfg.dataset, "name the hub image dataset (owner/name)")


@calibration_source(
    "hub_images", "vision", schema.HubImagesConfig, hub_datasets=hub_image_datasets, settings=hub_dataset_named
)
def hub_images(cfg, n: int | None = None) -> dict[str, "Image.Image"]:  # noqa: F821
    """The first ``n`` images of ``cfg.dataset`` (``cfg.split``, column ``cfg.image_column``),
    streamed from the hub (the paper calibrates CLIP on MIMIC)."""
    from datasets import load_dataset

    try:
        records = load_dataset(cfg.dataset, cfg.subset, split=cfg.split, streaming=True)
    except Exception as err:  # noqa: BLE001 - offline, gated, no such dataset
        raise ConfigError("calibration.dataset", cfg.dataset, f"cannot be loaded ({err})") from err
    n = int(cfg.n_samples) if n is None else n
    out = {}
    for i, record in enumerate(records):
        if i >= n:
            break
        if cfg.image_column not in record:
            raise ConfigError("calibration.image_column", cfg.image_column, f"not a column of {cfg.dataset}")
        out[f"{cfg.dataset}/{i}"] = record[cfg.image_column].convert("RGB")
    return out


def augmented(images: list["Image.Image"], n: int, seed: int) -> list["Image.Image"]:  # noqa: F821
    """``n`` images: the given ones, then seeded random crops (25-100% of the area, aspect 3:4 to
    4:3) with random horizontal flips of them, in order."""
    from PIL import Image

    out = list(images[:n])
    rng = random.Random(seed)
    while len(out) < n:
        image = images[len(out) % len(images)]
        width, height = image.size
        area = rng.uniform(0.25, 1.0) * width * height
        aspect = rng.uniform(3 / 4, 4 / 3)
        w = min(width, max(1, round((area * aspect) ** 0.5)))
        h = min(height, max(1, round((area / aspect) ** 0.5)))
        left, top = rng.randint(0, width - w), rng.randint(0, height - h)
        crop = image.crop((left, top, left + w, top + h))
        out.append(crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop)
    return out


def image_digest(images: dict) -> str:
    """Hash of the images' names and pixels."""
    h = hashlib.sha256()
    for name, image in sorted(images.items()):
        h.update(name.encode() + b"|" + f"{image.size}".encode() + image.tobytes())
    return h.hexdigest()[:16]


def build_image_calibration(cfg, processor, patch_size: int, cache_dir: str | os.PathLike) -> TokenBatches:
    """``cfg.n_samples`` images from ``cfg.source``, augmented when the source has fewer (see the
    module docstring), processed by ``processor`` (a transformers image processor) into batches
    of ``cfg.batch_size``; every image position (a ``patch_size`` patch, and the class token) is a
    token. The pixel tensor is cached under ``cache_dir/images`` by (images, processor settings,
    n_samples, seed)."""
    n, batch_size, seed = int(cfg.n_samples), int(cfg.batch_size), int(cfg.seed)
    for key, value in (("n_samples", n), ("batch_size", batch_size)):
        if value <= 0:
            raise ConfigError(f"calibration.{key}", value, "must be a positive integer")
    source = CALIBRATION_SOURCES.get(cfg.source)
    if source.modality != "vision":
        raise ConfigError("calibration.source", cfg.source, "is text, not images")
    images = source.read(cfg)
    settings = json.dumps(processor.to_dict(), sort_keys=True, default=str)
    digest = image_digest(images)
    file_name = hashlib.sha256(f"{digest}|{settings}|{n}|{seed}".encode()).hexdigest()[:24]
    path = Path(cache_dir) / "images" / f"{file_name}.pt"
    key = {"kind": "image calibration", "images": digest, "processor": settings, "n_samples": n, "seed": seed}
    remove_dead_temporaries(path.parent)
    entry = read_keyed_tensors(path, key, "image calibration cache entry")
    pixels = None if entry is None else entry.get("pixels")
    if pixels is not None and (pixels.ndim != 4 or pixels.shape[0] != n):
        problem = f"holds pixels of shape {tuple(pixels.shape)} for {n} images"
        discard_entry(path, "image calibration cache entry", problem)
        pixels = None
    if pixels is None:
        ordered = [images[name] for name in sorted(images)]
        pixels = processor(images=augmented(ordered, n, seed), return_tensors="pt")["pixel_values"]
        entry = {"pixels": pixels}
        write_optional("image calibration cache entry", path, lambda: write_keyed_tensors(path, key, entry))
    positions = (pixels.shape[-2] // patch_size) * (pixels.shape[-1] // patch_size) + 1
    batches = [
        ImageBatch(chunk, torch.ones(chunk.shape[0], positions, dtype=torch.long)) for chunk in pixels.split(batch_size)
    ]
    log.info("image calibration: %d images (%d distinct, %s), %d positions each", n, len(images), cfg.source, positions)
    return TokenBatches(batches, positions)
