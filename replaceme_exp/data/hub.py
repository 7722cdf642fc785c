"""Hub datasets a job will read, resolved before the model loads.

A dataset is available when the ``datasets`` library can load it here: offline (``HF_DATASETS_OFFLINE``
or ``HF_HUB_OFFLINE``), only from its local cache, which is what is looked up, without loading
anything: the prepared copy under the datasets cache (``<owner>___<name>/<configuration>/<version>/
<hash>/``, where ``datasets`` finds it offline), a file a packaged builder (``json``, ``csv``, ...)
downloads from a URL under ``downloads/``, a file of the repository read with ``hf_hub_download`` in
the hub cache (``huggingface_hub.try_to_load_from_cache``). Online, a dataset not in the cache is
looked up on the hub (one metadata request, a few seconds at most): an unreachable hub or an unknown
dataset is said then, not after the model loaded and was pruned. The caches are the ones a new
process would use (``HF_HOME``, ``HF_DATASETS_CACHE``, ``HF_HUB_CACHE``, read when checked).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replaceme_exp.errors import ConfigError

log = logging.getLogger(__name__)

_TRUE = ("1", "ON", "YES", "TRUE")
# Seconds the hub may take to answer the metadata request of an uncached dataset.
HUB_TIMEOUT = 10.0


@dataclass(frozen=True)
class HubDataset:
    """A dataset a job reads through ``datasets.load_dataset(path, name, data_files=...)`` (and the
    repository files ``repo_files`` it reads with ``hf_hub_download``). ``key`` and ``value``: the
    configuration that asks for it (for the message); ``instead``: what to choose without it."""

    key: str
    value: Any
    path: str
    name: str | None = None
    data_files: tuple[str, ...] = ()
    repo_files: tuple[str, ...] = ()
    instead: str = ""

    def describe(self) -> str:
        if self.data_files:
            return f"{self.path} files {', '.join(self.data_files)}"
        return f"the hub dataset {self.path}" + (f" ({self.name})" if self.name else "")


def offline_variable() -> str | None:
    """The variable that keeps ``datasets`` offline (``HF_DATASETS_OFFLINE``, else ``HF_HUB_OFFLINE``
    / ``TRANSFORMERS_OFFLINE`` as huggingface_hub reads them), or None when it may go online."""
    datasets_flag = os.environ.get("HF_DATASETS_OFFLINE")
    if datasets_flag is not None:
        return "HF_DATASETS_OFFLINE" if datasets_flag.upper() in _TRUE else None
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if (os.environ.get(name) or "").upper() in _TRUE:
            return name
    return None


def _hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(os.path.expandvars(os.environ.get("HF_HOME", str(default)))).expanduser()


def datasets_cache() -> Path:
    """Where ``datasets`` keeps prepared datasets and downloads (``HF_DATASETS_CACHE``)."""
    return Path(os.environ.get("HF_DATASETS_CACHE", _hf_home() / "datasets")).expanduser()


def hub_cache() -> Path:
    """Where huggingface_hub keeps repository files (``HF_HUB_CACHE``)."""
    return Path(os.environ.get("HF_HUB_CACHE", _hf_home() / "hub")).expanduser()


def prepared(path: str, name: str | None) -> bool:
    """Whether the datasets cache holds a prepared copy of the hub dataset ``path`` (its
    configuration ``name``; None: any), as ``datasets`` looks for it offline."""
    from datasets.naming import camelcase_to_snakecase

    parts = path.split("/")
    root = datasets_cache() / "___".join([*parts[:-1], camelcase_to_snakecase(parts[-1])])
    configs = [name, f"{name}-*"] if name else ["*"]
    return any(p.is_dir() for pattern in configs for p in root.glob(f"{pattern}/*/*"))


def downloaded(url: str) -> bool:
    """Whether ``datasets`` downloaded ``url`` (its ``downloads/<sha256 of the url>[.<etag hash>]``)."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()
    folder = Path(os.environ.get("HF_DATASETS_DOWNLOADED_DATASETS_PATH", datasets_cache() / "downloads"))
    return any(not p.name.endswith((".lock", ".json", ".incomplete")) for p in folder.glob(f"{digest}*"))


def _packaged_builders() -> frozenset[str]:
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:  # a datasets release that moved it: the builders of today's
        return frozenset(("json", "csv", "parquet", "text", "arrow", "pandas", "imagefolder", "webdataset"))
    return frozenset(_PACKAGED_DATASETS_MODULES)


def missing_locally(dataset: HubDataset) -> str | None:
    """What of ``dataset`` is not on this machine, said after "which" (None: all of it is, or it
    is a local folder)."""
    if dataset.path in _packaged_builders():
        for file in dataset.data_files:
            if "://" in file and not downloaded(file):
                return f"are not in the datasets download cache ({datasets_cache() / 'downloads'})"
            if "://" not in file and not Path(file).expanduser().exists():
                return f"do not exist ({file})"
        return None
    if Path(dataset.path).expanduser().is_dir():
        return None
    if not prepared(dataset.path, dataset.name):
        return f"is not in the local datasets cache ({datasets_cache()})"
    from huggingface_hub import try_to_load_from_cache

    for file in dataset.repo_files:
        if not isinstance(try_to_load_from_cache(dataset.path, file, cache_dir=hub_cache(), repo_type="dataset"), str):
            return f"has a file ({file}) that is not in the hub cache ({hub_cache()})"
    return None


def _no_answer(err: BaseException) -> bool:
    """A request that got no answer: offline mode, no connection, a timeout (``TransportError`` of
    the HTTP library huggingface_hub uses)."""
    return isinstance(err, (ConnectionError, TimeoutError)) or any(
        cls.__name__ == "TransportError" for cls in type(err).__mro__
    )


def hub_answer(dataset: HubDataset) -> str | None:
    """Online: why the hub cannot give ``dataset`` (unreachable, no such dataset), or None."""
    if dataset.path in _packaged_builders():  # files from URLs: fetched when read
        return None
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(dataset.path, timeout=HUB_TIMEOUT)
    except RepositoryNotFoundError:
        return "is not a dataset on the hub (or a private one: log in with a token that can read it)"
    except HfHubHTTPError as err:  # the hub answered (gated, an error of its own): loading will tell
        log.debug("hub lookup of %s: %s", dataset.path, err)
    except Exception as err:
        if not _no_answer(err):
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        return f"the hub cannot be reached ({type(err).__name__}: {first})"
    return None


def require_available(datasets: list[HubDataset]) -> None:
    """Every dataset of ``datasets`` is in the local cache, or (online) on a reachable hub; the
    first that is not raises one :class:`ConfigError` naming its key, what is missing and what to
    do. Cheap: file lookups, and one hub request per uncached dataset when online."""
    seen: set[tuple] = set()
    answers: dict[str, str | None] = {}  # one hub request per repository
    offline = offline_variable()
    for dataset in datasets:
        identity = (dataset.path, dataset.name, dataset.data_files, dataset.repo_files)
        if identity in seen:
            continue
        seen.add(identity)
        missing = missing_locally(dataset)
        if missing is None:
            continue
        instead = f", or {dataset.instead}" if dataset.instead else ""
        if offline:
            cache = ""
            if not dataset.data_files:
                load = ", ".join(repr(a) for a in (dataset.path, dataset.name) if a)
                cache = f", or cache it once online (datasets.load_dataset({load}))"
            reason = f"reads {dataset.describe()}, which {missing}, and {offline}=1 keeps the job offline"
            raise ConfigError(dataset.key, dataset.value, f"{reason}: run it online{cache}{instead}")
        if dataset.path not in answers:
            answers[dataset.path] = hub_answer(dataset)
        if answer := answers[dataset.path]:
            reason = f"reads {dataset.describe()}, which is not in the local cache, and {answer}"
            raise ConfigError(dataset.key, dataset.value, f"{reason}: check the network and the name{instead}")
