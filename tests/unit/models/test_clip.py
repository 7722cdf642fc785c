"""CLIP's vision encoder (random weights: no CLIP checkpoint is available offline): capture
against activations computed module by module, the pruned encoder against a hand-built one with
the blocks bypassed and T applied explicitly, save / reload, layer-wise capture."""

from __future__ import annotations

import pytest
from helpers.clip import CLIP_JOB, image_calibration


def test_bundled_images_are_real_photographs_shipped_with_installed_packages():
    from replaceme_exp.data.images import bundled_images

    found = bundled_images()
    assert len(found) >= 28 and {"chelsea", "coffee", "astronaut", "rocket", "china", "flower"} <= set(found)
    assert all(image.mode == "RGB" and min(image.size) >= 25 for image in found.values())


def test_an_image_folder_calibrates_and_a_missing_one_is_refused(tmp_path):
    from PIL import Image

    from replaceme_exp.errors import ConfigError

    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    for i, path in enumerate([folder / "a.png", folder / "sub" / "b.jpg"]):
        Image.new("RGB", (40 + i, 50), color=(10 * i, 100, 200)).save(path)
    (folder / "notes.txt").write_text("not an image")
    batches = image_calibration(tmp_path, source="image_folder", path=str(folder), n_samples=5)
    assert sum(b.pixel_values.shape[0] for b in batches) == 5
    with pytest.raises(ConfigError, match="calibration.path='/nowhere': no such image folder"):
        image_calibration(tmp_path, source="image_folder", path="/nowhere")


def test_image_calibration_for_a_text_model_is_refused_in_one_line():
    from helpers.config import compose_config, validate_config

    from replaceme_exp.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^calibration.source='bundled_images': is image data for vision encoders"):
        validate_config(compose_config(["calibration=bundled_images"]))
    validate_config(compose_config(["calibration=bundled_images", "model=clip_vit_l14", "eval=clip"]))


@pytest.mark.parametrize(
    "override,key",
    [("calibration=pydoc", "calibration.source"), ("healing=lora", "healing"), ("eval=quick", "eval")],
)
def test_text_settings_for_a_clip_job_are_refused_in_one_line(tmp_path, override, key):
    from helpers.config import compose_config

    from replaceme_exp.runtime import run_recorded

    row = run_recorded(compose_config([*CLIP_JOB, override, f"results_dir={tmp_path}"]), raise_on_failure=False)
    assert row["status"] == "failed" and row["error"].startswith(f"ConfigError: {key}=") and "\n" not in row["error"]
