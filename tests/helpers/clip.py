"""What the unit and integration tests of clip share: fixtures, builders and constants."""

from __future__ import annotations

import torch


def images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def tiny_processor():
    from transformers import CLIPImageProcessorPil

    return CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def image_calibration(tmp_path, **overrides):
    from replaceme_exp.config.validate import build_option
    from replaceme_exp.data.images import build_image_calibration

    settings = {"source": "bundled_images", "n_samples": 40, "batch_size": 16, "seed": 0, **overrides}
    cfg = build_option("calibration", {"name": settings["source"], **settings}, "calibration")
    return build_image_calibration(cfg, tiny_processor(), 8, tmp_path / "cache")


CLIP_JOB = [
    "model=tiny_clip",
    "calibration=bundled_images",
    "calibration.n_samples=48",
    "eval=clip_offline",
    "n_prune=2",
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
]
