"""A checkpoint's shape and parameter counts before the load, from its config and its safetensors
headers (replaceme_exp/models/shape.py, replaceme_exp/capture/execution.py): the same numbers as
transformers' config and the model built on the meta device, without importing transformers (the
start-up's cost; the load imports it)."""

from __future__ import annotations

import pytest
from helpers.config import CACHE
from helpers.model_shape import model_cfg
from helpers.models import tiny_model

from replaceme_exp.capture.execution import parameter_counts
from replaceme_exp.models.shape import model_shape


def test_random_weights_are_still_built_on_the_meta_device():
    cfg = model_cfg("debug=smoke")
    assert parameter_counts(cfg, str(CACHE)) is None
    assert model_shape(cfg, CACHE).model is not None


def test_a_random_vocabulary_smaller_than_its_tokenizer_is_refused_before_the_load():
    """The random model reads SmolLM2's token ids (``tokenizer: embedded``): an embedding with fewer
    rows would fail in the capture's lookup with no word of the vocabulary (issue 50)."""
    from replaceme_exp.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        model_shape(model_cfg("debug=smoke", "model.config.vocab_size=10"), CACHE)
    assert err.value.key == "model.config.vocab_size" and err.value.value == 10
    assert "49151" in str(err.value) and "49152" in str(err.value)
    assert model_shape(model_cfg("debug=smoke", "model.config.vocab_size=49152"), CACHE).vocab_size == 49152


@pytest.mark.parametrize("source", ["random", "local"])
def test_token_ids_past_the_embedding_are_refused_before_the_model_reads_them(source):
    from helpers.batches import batches_of

    from replaceme_exp.errors import ConfigError
    from replaceme_exp.models.loading import LoadedModel
    from replaceme_exp.pipeline.text import check_token_ids

    loaded = LoadedModel(model=tiny_model("llama", num_layers=2, vocab=128), tokenizer=None, name="tiny")
    overrides = ["debug=smoke"] if source == "random" else ["model=smollm2_135m", "model.source=local", "model.pretrained=/ckpt"]
    cfg = model_cfg(*overrides)
    check_token_ids(batches_of([[1, 2, 127], [5]], 2), loaded, cfg, "calibration")  # every id has a row
    with pytest.raises(ConfigError) as err:
        check_token_ids(batches_of([[1, 2, 3], [5, 128]], 2), loaded, cfg, "eval")
    assert (err.value.key, err.value.value) == (
        ("model.config.vocab_size", 128) if source == "random" else ("model.pretrained", "/ckpt")
    )
    assert "128 rows" in str(err.value) and "id 128" in str(err.value) and "eval" in str(err.value)
