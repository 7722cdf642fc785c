"""A Hugging Face cache of the tests' own: an empty one per test (offline, deterministic), and a hub
dataset placed in it as ``datasets`` leaves a dataset it prepared (no download)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest


def empty_offline_cache(monkeypatch: pytest.MonkeyPatch, root: Path) -> Path:
    """Point every Hugging Face cache at an empty ``root`` and keep the hub off (also in ``datasets``
    when an earlier test imported it: it reads its cache paths once, at import); returns the
    datasets cache."""
    for name, sub in (("HF_HOME", ""), ("HF_DATASETS_CACHE", "datasets"), ("HF_HUB_CACHE", "hub")):
        monkeypatch.setenv(name, str(root / sub))
    monkeypatch.delenv("HF_DATASETS_DOWNLOADED_DATASETS_PATH", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    if (imported := sys.modules.get("datasets.config")) is not None:
        paths = {"HF_DATASETS_CACHE": "", "DOWNLOADED_DATASETS_PATH": "downloads"}
        for name, sub in {**paths, "EXTRACTED_DATASETS_PATH": "downloads/extracted"}.items():
            monkeypatch.setattr(imported, name, root / "datasets" / sub)
        monkeypatch.setattr(imported, "HF_DATASETS_OFFLINE", True)
    return root / "datasets"


def cache_hub_dataset(datasets_cache: Path, path: str, name: str, records: list[dict]) -> Path:
    """``records`` as the prepared copy of the hub dataset ``path`` (configuration ``name``, split
    ``train``) under ``datasets_cache``: ``<owner>___<name>/<name>/0.0.0/<hash>/`` (a dataset without an
    owner, such as ``wikitext``: ``<name>/<name>/0.0.0/<hash>/``) with its
    ``dataset_info.json`` and ``<name>-train.arrow``, built by the ``json`` builder from a local file
    and moved where ``datasets`` looks for a hub dataset it prepared. Returns that folder."""
    import datasets
    from datasets.naming import camelcase_to_snakecase

    work = datasets_cache.parent / "build"
    work.mkdir(parents=True, exist_ok=True)
    source = work / "records.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in records))
    builder = datasets.load_dataset_builder("json", data_files={"train": [str(source)]}, cache_dir=str(work))
    builder.download_and_prepare()
    built = Path(builder.cache_dir)
    *owner, dataset = path.split("/")
    folder = "___".join([*owner, camelcase_to_snakecase(dataset)])
    target = datasets_cache / folder / name / "0.0.0" / "00000000"
    shutil.copytree(built, target)
    info = json.loads((target / "dataset_info.json").read_text())
    info.update(config_name=name, dataset_name=camelcase_to_snakecase(dataset))
    (target / "dataset_info.json").write_text(json.dumps(info))
    (target / "json-train.arrow").rename(target / f"{camelcase_to_snakecase(dataset)}-train.arrow")
    shutil.rmtree(work)
    return target
